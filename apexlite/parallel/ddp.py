"""apexlite's DistributedDataParallel: torch DDP plus a gradient-communication dtype and O2 care.

- `reduce_dtype` / `gradient_predivide_factor` / `gradient_average` install `reduce_hook`
  (comm_hooks.py); with none of them set, torch's own C++ all-reduce runs untouched.
- O2 master weights are built by `amp.initialize`, before DDP exists, from each rank's own
  weights. DDP broadcasts rank 0's model params, so the masters are broadcast too
  (`broadcast_master_params`), else the ranks' fp32 masters would differ from the first step on.
- `enable_allreduce()` / `disable_allreduce()` toggle DDP's gradient sync (what `no_sync()` does),
  for gradient accumulation written against the legacy API.
- `ddp_from_apex_args` maps the legacy wrapper's arguments onto this class (for apexlite.compat).

Wrap the model AFTER `amp.initialize`, as with any parallel wrapper.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from apexlite._logging import get_logger
from apexlite.parallel.comm_hooks import ReduceConfig, reduce_hook

log = get_logger("parallel")


def broadcast_master_params(module: torch.nn.Module, process_group: Optional[Any] = None) -> int:
    """Broadcast, from the group's first rank, the O2 fp32 masters of `module`'s params.

    Returns how many masters were broadcast (0 without an amp session or without O2).
    """
    from apexlite.amp.session import current_session

    session = current_session(required=False)
    if session is None:
        return 0
    owned = {id(p) for p in module.parameters()}
    masters = [master for state in list(session.optimizers.values())
               for param, master in state.grads.master_pairs() if id(param) in owned]
    # the group's rank 0 by its global rank: broadcast's group_src= spelling needs torch >= 2.6
    source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    with torch.no_grad():
        for master in masters:
            dist.broadcast(master, src=source, group=process_group)
    return len(masters)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch DDP, with apexlite's options (keyword-only; every torch DDP argument is accepted).

    Args:
        module: the model, already returned by `amp.initialize`.
        reduce_dtype (default None): dtype the gradients are all-reduced in (e.g. torch.bfloat16).
            None keeps each bucket's dtype (fp32 under O0/O1, fp16/bf16 under O2/O3).
        gradient_predivide_factor (default None = world size): divide by this before the sum and by
            world_size / factor after it. The default divides fully before the sum (overflow-safe).
        gradient_average (default True): False sums gradients instead of averaging (a given
            gradient_predivide_factor still divides the sum, as in apex).
        broadcast_masters (default True): broadcast O2 fp32 masters from rank 0 after DDP's own
            parameter broadcast.
    """

    def __init__(self, module: torch.nn.Module, *args: Any, reduce_dtype: Optional[torch.dtype] = None,
                 gradient_predivide_factor: Optional[float] = None, gradient_average: bool = True,
                 broadcast_masters: bool = True, **kwargs: Any) -> None:
        if reduce_dtype is not None and not (isinstance(reduce_dtype, torch.dtype) and reduce_dtype.is_floating_point):
            raise ValueError(f"reduce_dtype must be a floating torch.dtype (e.g. torch.bfloat16); got {reduce_dtype!r}.")
        if gradient_predivide_factor is not None and not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0; got {gradient_predivide_factor!r}.")
        super().__init__(module, *args, **kwargs)
        self.reduce_config = ReduceConfig(reduce_dtype, gradient_predivide_factor, gradient_average,
                                          self.process_group)
        if reduce_dtype is not None or gradient_predivide_factor is not None or not gradient_average:
            self.register_comm_hook(self.reduce_config, reduce_hook)
        if broadcast_masters and kwargs.get("init_sync", True):
            broadcast_master_params(module, self.process_group)

    def enable_allreduce(self) -> None:
        """Sync gradients in backward again (the default)."""
        self.require_backward_grad_sync = True

    def disable_allreduce(self) -> None:
        """Keep gradients local until `enable_allreduce()` (gradient accumulation)."""
        self.require_backward_grad_sync = False


_IGNORED_APEX_ARGS = {
    "allreduce_trigger_params": None, "retain_allreduce_buffers": False, "num_allreduce_streams": 1,
    "allreduce_communicators": None, "prof": False,
}


def _bucket_cap_mb(module: torch.nn.Module, elements: float) -> float:
    """A bucket of `elements` gradient elements, in MiB (apex sized buckets in elements)."""
    element_size = next((p.element_size() for p in module.parameters() if p.is_floating_point()), 4)
    return max(elements * element_size / 2 ** 20, 1e-6)


def ddp_from_apex_args(module: torch.nn.Module, message_size: int = 10000000, delay_allreduce: bool = False,
                       shared_param: Any = None, allreduce_trigger_params: Any = None,
                       retain_allreduce_buffers: bool = False, allreduce_always_fp32: bool = False,
                       num_allreduce_streams: int = 1, allreduce_communicators: Any = None,
                       gradient_average: bool = True, gradient_predivide_factor: float = 1.0,
                       gradient_average_split_factor: Optional[float] = None, prof: bool = False,
                       **ddp_kwargs: Any) -> DistributedDataParallel:
    """Build apexlite's DDP from the legacy apex wrapper's arguments (same names and defaults).

    Mapping: message_size -> bucket_cap_mb (elements x element size); delay_allreduce -> one bucket
    for the whole model (reduction starts when backward has produced every gradient, except torch's
    small first bucket) and find_unused_parameters=True (params the forward did not use, as apex
    allowed); allreduce_always_fp32 -> reduce_dtype=torch.float32; gradient_average and
    gradient_predivide_factor keep their meaning (the legacy default 1.0 divides after the sum);
    gradient_average_split_factor is the old name of the predivide factor. Stream, communicator,
    trigger-param, buffer-retention and profiling options have no torch DDP equivalent: accepted and
    logged. `ddp_kwargs` go to torch DDP unchanged.
    """
    if shared_param is not None:
        raise ValueError("shared_param is not supported (it never changed what was communicated); "
                         "use delay_allreduce=True to reduce after the whole backward pass.")
    if delay_allreduce and num_allreduce_streams > 1:
        raise ValueError("num_allreduce_streams > 1 requires delay_allreduce=False.")
    if delay_allreduce and allreduce_trigger_params is not None:
        raise ValueError("allreduce_trigger_params requires delay_allreduce=False.")
    given = dict(allreduce_trigger_params=allreduce_trigger_params, retain_allreduce_buffers=retain_allreduce_buffers,
                 num_allreduce_streams=num_allreduce_streams, allreduce_communicators=allreduce_communicators, prof=prof)
    ignored = [name for name, default in _IGNORED_APEX_ARGS.items() if given[name] != default]
    if ignored:
        log.info("DistributedDataParallel: %s have no torch DDP equivalent and are ignored", ", ".join(ignored))
    if gradient_average_split_factor is not None:
        gradient_predivide_factor = gradient_average_split_factor
    elements = sum(p.numel() for p in module.parameters()) if delay_allreduce else message_size
    kwargs: Dict[str, Any] = dict(bucket_cap_mb=_bucket_cap_mb(module, elements))
    if delay_allreduce:  # apex reduced whatever grads the backward made, as find_unused_parameters lets torch's
        kwargs["find_unused_parameters"] = True
    kwargs.update(ddp_kwargs)
    return DistributedDataParallel(
        module, reduce_dtype=torch.float32 if allreduce_always_fp32 else None,
        gradient_predivide_factor=gradient_predivide_factor, gradient_average=gradient_average, **kwargs)
