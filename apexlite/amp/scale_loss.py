"""`scale_loss` and `disable_casts`, the context managers of the training loop."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpUsageError
from apexlite.amp.o1.cache import compile_flag
from apexlite.amp.scaler import LossScaler
from apexlite.amp.session import NOT_INITIALIZED_MESSAGE, AmpSession, current_session

log = get_logger("amp")


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
    `model` is accepted for apex compatibility and unused. `delay_overflow_check=True` leaves the scale
    and the skip to the script's own `update_scale()` (NVIDIA's BERT checks its all-reduced grads there),
    as apex did; a step reached without that call is checked then, so no inf/NaN step reaches the weights.
    If the block raises, its gradients are unscaled (or dropped if they overflowed), the scaler is
    left as it was, and the exception propagates.
    """
    session = current_session(required=True, message=NOT_INITIALIZED_MESSAGE)
    if not isinstance(loss, torch.Tensor):
        raise AmpUsageError(
            f"amp.scale_loss needs the loss tensor (before .item()), one per block; got {type(loss).__name__}"
            + (": sum the losses, or give each its own block and loss_id" if isinstance(loss, (list, tuple)) else "")
            + ".")
    if isinstance(loss_id, bool) or not hasattr(loss_id, "__index__"):
        raise AmpUsageError(f"loss_id must be an int (0 .. num_losses - 1); got {loss_id!r}.")
    loss_id = loss_id.__index__()
    if not session.properties.enabled:
        yield loss
        return
    if not 0 <= loss_id < len(session.loss_scalers):
        raise AmpUsageError(
            f"loss_id={loss_id} is out of range: amp.initialize was called with "
            f"num_losses={len(session.loss_scalers)}, so loss_id must be in 0..{len(session.loss_scalers) - 1}."
        )
    amp_optimizers = [session.amp_optimizer(opt) for opt in _as_optimizer_list(optimizers)]
    with scaled_backward(session, loss, amp_optimizers, session.loss_scalers[loss_id], loss_id,
                         delay_unscale, delay_overflow_check=delay_overflow_check) as scaled:
        yield scaled


@contextlib.contextmanager
def scaled_backward(session: AmpSession, loss: torch.Tensor, amp_optimizers: List[Any], scaler: LossScaler,
                    loss_id: int, delay_unscale: bool, as_float: bool = True,
                    delay_overflow_check: bool = False) -> Iterator[torch.Tensor]:
    """The body of every scale_loss (`amp.scale_loss`, the handle's and OptimWrapper's). With
    `delay_overflow_check`, the overflow flags gather until `scaler.update_scale()` reads them."""
    session.stats.record_loss(loss, scaler.loss_scale())
    # The forward is over: the graph keeps the casts it saved, and the cache letting go of them now
    # lets backward free each one as soon as its node has run (as torch.autocast's cache does).
    session.release_casts()
    base = loss.float() if as_float else loss
    if not scaler.checks_overflow and not any(o.has_masters for o in amp_optimizers):
        # Static scale 1.0 without master weights: the scaled loss is the loss; nothing to unscale.
        try:
            yield base
        finally:
            session.end_iteration()
        return

    for amp_optimizer in amp_optimizers:
        amp_optimizer.prepare_backward(scaler.loss_scale())
    watch = None
    try:
        scaled = base * scaler.loss_scale()
        watch = _watch(scaler.loss_scale(), scaled)
        yield scaled
    except BaseException:
        if watch is not None:
            watch.block_ended = True
        try:
            _settle_after_error(amp_optimizers, scaler, delay_unscale)
        except Exception as cleanup_error:  # the user's exception is the one to see
            log.warning("apexlite: could not settle the gradients of a failed scale_loss block: %r", cleanup_error)
        finally:
            session.end_iteration()
        raise
    watch.block_ended = True
    watch.warn_if_not_backpropagated(amp_optimizers)
    try:
        if not delay_unscale and not scaler.overflow_check_pending:
            scaler.clear_overflow_state()
        for amp_optimizer in amp_optimizers:
            amp_optimizer.post_backward(scaler, delay_unscale)
        if not delay_unscale and delay_overflow_check:
            scaler.overflow_check_pending = True
            for amp_optimizer in amp_optimizers:
                amp_optimizer.defer_overflow_check(loss_id, scaler)
        elif not delay_unscale:
            if scaler.update_scale():
                for amp_optimizer in amp_optimizers:
                    amp_optimizer.skip_next_step(loss_id, scaler)
                scaler.count_loss(loss)  # stops a run whose loss itself stays inf/NaN
            else:
                scaler.note_clean_step()
    finally:
        session.end_iteration()


class _ScaledLossWatch:
    """Whether the scaled loss a block yields is backpropagated inside the block (a hook on it, registered
    eagerly: see `_watch`). After the block its grads would reach the step still multiplied by the loss scale (raised
    at that backward, before any grad is written); a block that made grads by another backward (`loss.backward()`)
    has them divided by the scale on leaving (warned)."""

    def __init__(self, scale: float, scaled: torch.Tensor) -> None:
        self.scale = scale
        self.block_ended = False
        self.backpropagated = False
        self.watching = scaled.requires_grad
        if self.watching:
            scaled.register_hook(self._on_backward)

    def _on_backward(self, grad: torch.Tensor) -> None:
        if self.block_ended:
            raise AmpUsageError(
                "the scaled loss yielded by amp.scale_loss was backpropagated after its `with` block ended: the grads "
                f"would reach optimizer.step() still multiplied by the loss scale ({self.scale:g}). Call "
                "`scaled_loss.backward()` inside the block: `with amp.scale_loss(loss, optimizer) as scaled_loss: "
                "scaled_loss.backward()`.")
        self.backpropagated = True

    def warn_if_not_backpropagated(self, amp_optimizers: List[Any]) -> None:
        """Only where the block made grads (a block that skipped its backward on purpose, a NaN loss, made none)."""
        if self.watching and not self.backpropagated and any(o.new_grads() for o in amp_optimizers):
            log.warning(
                "amp.scale_loss: the block ended without a backward of the scaled loss it yielded. If it ran "
                "`loss.backward()` on the unscaled loss, its grads were just divided by the loss scale (%g) and the "
                "update will be that much too small: call `scaled_loss.backward()` inside the block.", self.scale)


@torch._disable_dynamo  # under torch.compile: run as it is (a traced scale would recompile at each new value)
def _watch(scale: float, scaled: torch.Tensor) -> "_ScaledLossWatch":
    return _ScaledLossWatch(scale, scaled)


def _settle_after_error(amp_optimizers: List[Any], scaler: LossScaler, delay_unscale: bool) -> None:
    """Leave grads as a correct unscaled backward would, and the scaler untouched.

    Finite new grads are unscaled and merged with the older ones exactly as on a normal exit; new
    grads that overflowed are dropped (the older grads come back as they were). No step is skipped
    and the scale does not move: the block did not finish.
    """
    if delay_unscale:
        for amp_optimizer in amp_optimizers:
            amp_optimizer.post_backward(scaler, delay_unscale=True)
        return
    scaler.clear_overflow_state()
    overflow = False
    if scaler.checks_overflow:
        scaler.check([grad for amp_optimizer in amp_optimizers for grad in amp_optimizer.new_grads()])
        overflow = scaler.has_overflow()
        scaler.clear_overflow_state()
    for amp_optimizer in amp_optimizers:
        if overflow:
            amp_optimizer.discard_backward()
        else:
            amp_optimizer.post_backward(scaler, delay_unscale=False)


_compiling = compile_flag()  # True while torch.compile traces this code


class DisabledCasts(contextlib.ContextDecorator):
    """What `amp.disable_casts()` returns: a block with O1 casts off in the calling thread, left on that
    thread (cast_state.CastsOffBlock); also a decorator. The session is looked up on entering."""

    def __init__(self) -> None:
        self._block: Any = None

    def _recreate_cm(self) -> "DisabledCasts":
        return DisabledCasts()

    def __enter__(self) -> None:
        if _compiling():
            # A graph traced here would keep the casts (they are baked in when torch.compile traces the
            # patched ops): break the graph and enter eagerly, so the block is traced anew with the casts
            # really off.
            return torch._dynamo.disable(DisabledCasts._enter)(self)
        return self._enter()

    def _enter(self) -> None:
        if self._block is not None:
            raise RuntimeError("this amp.disable_casts() block is already entered; call amp.disable_casts() "
                               "again for each `with`.")
        session = current_session(
            required=True,
            message="amp.disable_casts() needs an active session: call amp.initialize(..., opt_level='O1') first.",
        )
        self._block = session.casts_disabled()
        self._block.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        if _compiling():  # the switch flips eagerly, as on entering
            return torch._dynamo.disable(DisabledCasts._exit)(self, *exc_info)
        return self._exit(*exc_info)

    def _exit(self, *exc_info: Any) -> bool:
        if self._block is None:
            raise RuntimeError("an amp.disable_casts() block was left without having been entered.")
        suppress = self._block.__exit__(*exc_info)  # refuses another thread before changing anything
        self._block = None
        return suppress


def disable_casts() -> DisabledCasts:
    """Run a block with O1 casts off in the calling thread (e.g. a custom op that needs its inputs untouched)."""
    return DisabledCasts()
