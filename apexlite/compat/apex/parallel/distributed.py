"""`apex.parallel.DistributedDataParallel` and `Reducer`, on torch.distributed.

apex's DDP becomes torch's DDP: gradients are allreduced and averaged over processes during
backward. apex's arguments are all accepted. Those that change results are honoured
(gradient_average, gradient_predivide_factor, allreduce_always_fp32, through a comm hook);
message_size maps to bucket_cap_mb; the ones that only tune overlap and streams
(delay_allreduce, allreduce_trigger_params, num_allreduce_streams, allreduce_communicators,
retain_allreduce_buffers, prof) are validated as apex did and logged once as not applicable.

The flat-buffer helpers BERT pretraining scripts call (`flat_dist_call`, `flatten`, `unflatten`, ...)
work as in apex, on torch's _flatten_dense_tensors/_unflatten_dense_tensors (apex's C++ versions did
the same) for tensors on any device.
"""
import inspect
import numbers
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from apexlite._logging import get_logger
from apexlite.compat import generic
from apexlite.parallel.ddp import broadcast_master_params

log = get_logger("compat.parallel")

_SHARED_PARAM_MESSAGE = (
    "shared_param is no longer supported as an option.  It was misleadingly named from the start.  "
    "It turns out overlapping communication with computation should work fine with shared parameters.  "
    "If you still wish to delay communication to the end of the backward pass, use "
    "delay_allreduce=True|False instead."
)


# apex chose between its C++ and torch's flatten at first use; apexlite always has torch's.
imported_flatten_impl = True


def import_flatten_impl() -> None:
    """Nothing to choose: flatten/unflatten are torch's (apex fell back to these without its C++ extension)."""


def flatten(bucket: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors of `bucket` concatenated into one flat tensor."""
    return _flatten_dense_tensors(bucket)


def unflatten(coalesced: torch.Tensor, bucket: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Views of a flat tensor with the shapes of the tensors of `bucket`."""
    return _unflatten_dense_tensors(coalesced, bucket)


def apply_flat_dist_call(bucket: Sequence[torch.Tensor], call: Callable[..., Any],
                         extra_args: Optional[Sequence[Any]] = None) -> None:
    """Run `call` (e.g. dist.all_reduce, dist.broadcast) once on the flattened bucket and copy the result back.

    After dist.all_reduce the result is divided by the world size (an average), as apex did. The
    tensors of one bucket must share dtype and device.
    """
    coalesced = flatten(bucket)
    call(coalesced, *(extra_args if extra_args is not None else ()))
    if call is dist.all_reduce:
        coalesced /= dist.get_world_size()
    for tensor, synced in zip(bucket, unflatten(coalesced, bucket)):
        tensor.copy_(synced)


def split_half_float_double(tensors: Sequence[torch.Tensor]) -> List[List[torch.Tensor]]:
    """The tensors grouped by dtype: float16, float32, float64, in that order, empty groups left out.

    apex grouped only CUDA tensors; apexlite groups tensors of any device.
    """
    buckets = [[t for t in tensors if t.dtype == dtype] for dtype in (torch.float16, torch.float32, torch.float64)]
    return [bucket for bucket in buckets if bucket]


def split_by_type(tensors: Sequence[torch.Tensor]) -> Dict[str, List[torch.Tensor]]:
    """The tensors grouped by `tensor.type()` (dtype and device), in first-seen order."""
    buckets: Dict[str, List[torch.Tensor]] = OrderedDict()
    for tensor in tensors:
        buckets.setdefault(tensor.type(), []).append(tensor)
    return buckets


def flat_dist_call(tensors: Sequence[torch.Tensor], call: Callable[..., Any],
                   extra_args: Optional[Sequence[Any]] = None) -> None:
    """`apply_flat_dist_call` on each group of same-type tensors: one collective per dtype and device."""
    for bucket in split_by_type(tensors).values():
        apply_flat_dist_call(bucket, call, extra_args)


def extract_tensors(maybe_tensor: Any, tensor_list: List[torch.Tensor]) -> None:
    """Append every tensor inside `maybe_tensor` (walking nested iterables; strings, where apex's recursed
    without end, are skipped) to `tensor_list`."""
    if torch.is_tensor(maybe_tensor):
        tensor_list.append(maybe_tensor)
        return
    if isinstance(maybe_tensor, (str, bytes)):
        return
    try:
        items = iter(maybe_tensor)
    except TypeError:
        return
    for item in items:
        extract_tensors(item, tensor_list)


def _average_hook(gradient_average: bool, predivide: float, always_fp32: bool) -> Callable[..., Any]:
    """A DDP comm hook: optional fp32 upcast, divide by `predivide`, allreduce-sum, then average."""

    # torch checks a comm hook's annotations, so they are real objects here (no postponed evaluation).
    def hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        tensor = buffer.float() if always_fp32 else buffer
        if predivide != 1.0:
            tensor.div_(predivide)
        world = dist.get_world_size(process_group)
        future = dist.all_reduce(tensor, group=process_group, async_op=True).get_future()

        def finish(fut: torch.futures.Future) -> torch.Tensor:
            reduced = fut.value()[0]
            if gradient_average:
                reduced.mul_(predivide / world)
            return reduced.to(buffer.dtype)

        return future.then(finish)

    return hook


# torch DDP's switch for "buffers broadcast at construction, not at each forward": newer torch names it
# forward_sync_buffers (and deprecates broadcast_buffers=False, which also skips the broadcast at init)
_BUFFERS_AT_INIT_ONLY = ({"forward_sync_buffers": False}
                         if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                         else {"broadcast_buffers": False})


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch DDP with apex's constructor. Wrap the model after `amp.initialize`, as with apex.

    As apex's: buffers are broadcast once, at construction, not at every forward (so one rank may evaluate
    alone); `delay_allreduce=True` reduces whatever grads a backward made (torch's find_unused_parameters,
    which may also be passed itself, as torch's error for unused params suggests)."""

    def __init__(self, module: torch.nn.Module, message_size: int = 10000000, delay_allreduce: bool = False,
                 shared_param: Any = None, allreduce_trigger_params: Any = None,
                 retain_allreduce_buffers: bool = False, allreduce_always_fp32: bool = False,
                 num_allreduce_streams: int = 1, allreduce_communicators: Any = None,
                 gradient_average: bool = True, gradient_predivide_factor: float = 1.0,
                 gradient_average_split_factor: Optional[float] = None, prof: bool = False, *,
                 find_unused_parameters: bool = False) -> None:
        if shared_param is not None:
            raise ValueError(_SHARED_PARAM_MESSAGE)
        if num_allreduce_streams > 1 and delay_allreduce:
            raise ValueError("self.allreduce_different_streams may only be used if delay_allreduce=False.")
        if allreduce_trigger_params is not None and delay_allreduce:
            raise ValueError("Setting allreduce_trigger_params is only valid if delay_allreduce=False.")
        if gradient_average_split_factor is not None:
            log.warning("gradient_average_split_factor is deprecated; use gradient_predivide_factor "
                        "(using %s as the predivide factor)", gradient_average_split_factor)
            gradient_predivide_factor = gradient_average_split_factor
        if (isinstance(gradient_predivide_factor, bool) or not isinstance(gradient_predivide_factor, numbers.Real)
                or not gradient_predivide_factor > 0):
            raise ValueError(f"gradient_predivide_factor must be a number > 0 (the sum is divided by it before and "
                             f"by world_size / it after); got {gradient_predivide_factor!r}.")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("apex.parallel.DistributedDataParallel needs torch.distributed initialised: call "
                               "torch.distributed.init_process_group(...) first (e.g. launch with torchrun).")
        tuning = {k: v for k, v in dict(prof=prof,
                                         allreduce_trigger_params=allreduce_trigger_params,
                                         num_allreduce_streams=num_allreduce_streams,
                                         allreduce_communicators=allreduce_communicators,
                                         retain_allreduce_buffers=retain_allreduce_buffers).items()
                  if v not in (None, False, 1)}
        if tuning:
            log.info("apex DDP tuning options %s do not apply to torch DDP (it overlaps allreduce with "
                     "backward itself); results are unchanged", sorted(tuning))
        first = next(module.parameters(), None)
        device_ids = [first.device.index] if first is not None and first.is_cuda else None
        element_size = first.element_size() if first is not None else 4
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=message_size * element_size / 2 ** 20,
                         find_unused_parameters=find_unused_parameters or delay_allreduce, **_BUFFERS_AT_INIT_ONLY)
        if "broadcast_buffers" in _BUFFERS_AT_INIT_ONLY:  # (older torch skips buffers at construction too then)
            for buffer in module.buffers():
                dist.broadcast(buffer, 0, group=self.process_group)
        # DDP broadcast rank 0's weights; amp.initialize built O2's fp32 masters before, from each rank's own
        broadcast_master_params(module, self.process_group)
        if not gradient_average or gradient_predivide_factor != 1.0 or allreduce_always_fp32:
            self.register_comm_hook(None, _average_hook(gradient_average, gradient_predivide_factor,
                                                       allreduce_always_fp32))

    def enable_allreduce(self) -> None:
        """Allreduce gradients in the next backward passes again (after `disable_allreduce`)."""
        self.require_backward_grad_sync = True

    def disable_allreduce(self) -> None:
        """Accumulate local gradients without communication (torch's `no_sync()`), e.g. between micro-batches."""
        self.require_backward_grad_sync = False


class Reducer:
    """Averages gradients across processes on demand: `reducer.reduce()` after backward.

    Given a module, its params are broadcast from rank 0 at construction and `reduce()` averages
    their grads; given a list of tensors, `reduce()` averages those tensors in place.
    """

    def __init__(self, module_or_grads_list: Union[torch.nn.Module, List[torch.Tensor]]) -> None:
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module: Optional[torch.nn.Module] = module_or_grads_list
            with torch.no_grad():
                for param in self.module.parameters():
                    dist.broadcast(param.data, 0)
            broadcast_master_params(self.module)
            self.grads: List[torch.Tensor] = []
        else:
            self.module = None
            self.grads = list(module_or_grads_list)

    def reduce(self) -> None:
        tensors = ([p.grad for p in self.module.parameters() if p.grad is not None] if self.module is not None
                   else self.grads)
        world = dist.get_world_size()
        for tensor in tensors:
            dist.all_reduce(tensor)
            tensor.div_(world)


__getattr__ = generic.fallback_getattr(__name__)
