"""`scale_loss` and `disable_casts`, the context managers of the training loop."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List

import torch

from apexlite.amp.errors import AmpUsageError
from apexlite.amp.session import NOT_INITIALIZED_MESSAGE, current_session


def _as_optimizer_list(optimizers: Any) -> List[Any]:
    if isinstance(optimizers, (list, tuple)):
        return list(optimizers)
    return [optimizers]


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizers: Any, loss_id: int = 0, model: Any = None,
               delay_unscale: bool = False, delay_overflow_check: bool = False) -> Iterator[torch.Tensor]:
    """Yield `loss` (as fp32) times the current loss scale; call `.backward()` on what it yields.

    On leaving the block the new gradients are unscaled (so clipping sees real values) and checked
    for inf/NaN in one device-side pass; an overflow skips the next `step()` of every optimizer
    given here and lowers the dynamic scale. `delay_unscale=True` leaves grads scaled for gradient
    accumulation; the last block of the accumulation must use the default `delay_unscale=False`.
    `model` is accepted for apex compatibility and unused.
    """
    session = current_session(required=True, message=NOT_INITIALIZED_MESSAGE)
    if not session.properties.enabled:
        yield loss
        return
    if not 0 <= loss_id < len(session.loss_scalers):
        raise AmpUsageError(
            f"loss_id={loss_id} is out of range: amp.initialize was called with "
            f"num_losses={len(session.loss_scalers)}, so loss_id must be in 0..{len(session.loss_scalers) - 1}."
        )
    amp_optimizers = [session.amp_optimizer(opt) for opt in _as_optimizer_list(optimizers)]
    scaler = session.loss_scalers[loss_id]
    session.stats.record_loss(loss)
    # The forward is over: the graph keeps the casts it saved, and the cache letting go of them now
    # lets backward free each one as soon as its node has run (as torch.autocast's cache does).
    session.release_casts()

    no_bookkeeping = not session.properties.master_weights and not scaler.checks_overflow
    if no_bookkeeping:
        # Static scale 1.0 without master weights: the scaled loss is the loss; nothing to unscale.
        try:
            yield loss.float()
        finally:
            session.end_iteration()
        return

    for amp_optimizer in amp_optimizers:
        amp_optimizer.prepare_backward()
    try:
        yield loss.float() * scaler.loss_scale()
    except BaseException:
        for amp_optimizer in amp_optimizers:
            amp_optimizer.abort_backward()
        session.end_iteration()
        raise
    try:
        if not delay_unscale:
            scaler.clear_overflow_state()
        for amp_optimizer in amp_optimizers:
            amp_optimizer.post_backward(scaler, delay_unscale)
        if not delay_unscale and not delay_overflow_check and scaler.update_scale():
            for amp_optimizer in amp_optimizers:
                amp_optimizer.skip_next_step(loss_id, scaler)
    finally:
        session.end_iteration()


def _compiling() -> bool:
    """True while torch.compile traces this code (torch >= 2.3 can tell; older versions say False)."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """Run a block with O1 casts off (e.g. a custom op that needs its inputs untouched)."""
    if _compiling():
        # A graph traced here would keep the casts (they are baked in when torch.compile traces the
        # patched ops): break the graph, so the block is traced anew with the casts really off.
        torch._dynamo.graph_break()
    session = current_session(
        required=True,
        message="amp.disable_casts() needs an active session: call amp.initialize(..., opt_level='O1') first.",
    )
    with session.casts_disabled():
        yield
