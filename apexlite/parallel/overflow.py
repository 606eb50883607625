"""Cross-rank agreement on gradient overflow: one tiny all-reduce (MAX) of the found-inf flag.

NOTE [overflow agreement]
Every rank must take the same decision after a `scale_loss` block (skip the step and halve the
scale, or step), or the loss scales and parameters drift apart. Whether the local found-inf flags
already agree depends on the setup:
- DDP averages gradients during backward, before `scale_loss` unscales and checks them, so an inf on
  one rank reaches every rank's gradients and the local flags agree by construction.
- They do NOT agree when each rank checks different gradients: FSDP / ZeRO-style sharded grads, a
  DDP `no_sync()` accumulation micro-batch, or a hand-written data-parallel loop.
So every loss scaler created while torch.distributed is initialized with world size > 1 all-reduces
its flag (MAX over the default group) just before the one host read in `LossScaler.has_overflow`.
That is 4 bytes per `scale_loss` per rank; in a single process the hook is None and costs nothing.
Every rank must then run the same number of checking `scale_loss` exits (the usual SPMD loop).

The amp layer knows nothing of torch.distributed: this module plugs `distributed_overflow_sync` into
it (`register_overflow_agreement`, done when apexlite is imported), and the session asks it for each
loss scaler it creates.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from apexlite._logging import get_logger
from apexlite.amp.scaler import FoundInf, OverflowSync
from apexlite.amp.session import current_session, register_overflow_agreement

log = get_logger("parallel")


def _comm_device(group: Optional[Any]) -> torch.device:
    """Where the flag must live for the group's backend (NCCL: the current GPU; else CPU)."""
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class AllReduceOverflow:
    """Callable installed on a LossScaler: makes its found-inf flags the MAX over `process_group`.

    The flags stay on their devices (no host sync is added: the scaler's `.item()` remains the only
    one). A rank that produced no gradient contributes 0 and still joins the collective, so no rank
    waits forever on another.
    """

    def __init__(self, process_group: Optional[Any] = None) -> None:
        self.process_group = process_group

    def __call__(self, found_inf: FoundInf) -> None:
        device = _comm_device(self.process_group)
        if found_inf:
            flag = torch.stack([f.to(device, non_blocking=True) for f in found_inf.values()]).amax(0)
        else:
            flag = torch.zeros(1, dtype=torch.float32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group)
        if not found_inf:
            found_inf[device] = flag
        for local in found_inf.values():
            if local is not flag:
                local.copy_(flag, non_blocking=True)


def distributed_overflow_sync() -> Optional[OverflowSync]:
    """The default for a new LossScaler: all-reduce over the world when distributed, else None."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return AllReduceOverflow(None)
    return None


def sync_overflow(process_group: Optional[Any] = None, *, enabled: bool = True,
                  scalers: Optional[Iterable[Any]] = None) -> None:
    """Set how the loss scalers of the current amp session agree on overflow.

    Args:
        process_group: the group whose ranks must agree (default: the whole world).
        enabled: False removes the all-reduce (only safe when every rank checks identical,
            already-reduced gradients, e.g. plain DDP without `no_sync()`).
        scalers: the LossScaler objects to configure (default: every scaler of the current session).
    """
    if scalers is None:
        session = current_session(
            message="apexlite.parallel.sync_overflow needs an amp session: call amp.initialize first.")
        scalers = session.loss_scalers
    for scaler in scalers:
        if enabled and not dist.is_initialized():
            raise RuntimeError(
                "apexlite.parallel.sync_overflow(enabled=True) needs torch.distributed: call "
                "torch.distributed.init_process_group(...) first.")
        scaler.overflow_sync = AllReduceOverflow(process_group) if enabled else None
    log.debug("overflow all-reduce %s (group=%s)", "on" if enabled else "off", process_group)


register_overflow_agreement(distributed_overflow_sync)
