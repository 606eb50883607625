"""A DDP communication hook that all-reduces gradient buckets in a chosen dtype, pre-divided.

Why pre-division: a sum of N finite fp16 values can overflow even though each is finite (loss-scaled
fp16 grads near 40000 from two ranks sum past fp16's 65504). Dividing each rank's contribution by
`gradient_predivide_factor` (default: the world size) before the sum keeps the mean's range; what
is left of the division (`factor / world_size`) is applied after the sum.

Dtype: with `reduce_dtype` equal to the bucket's dtype the bucket is reduced in place (no copy);
otherwise it is cast, reduced, and written back into the bucket. Both divisions happen in whichever of
the two dtypes has the wider range: before the cast when narrowing (fp32 -> fp16 sees already-shrunk
values), after it when widening (fp16 -> fp32 sums and averages in fp32 and writes back the mean, as apex's
allreduce_always_fp32 did: two ranks' fp16 grads of 40000 average to 40000, not an inf sum). Under O2 the model params are fp16/bf16, so their buckets already
are low precision and `reduce_dtype=None` (or the same dtype) communicates them without any cast.

(No `from __future__ import annotations` here: DDP checks the hook's annotations at runtime.)
"""
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist


@dataclass
class ReduceConfig:
    """State of `reduce_hook` (what `DistributedDataParallel` registers).

    reduce_dtype: dtype on the wire, or None for the bucket's own dtype.
    gradient_predivide_factor: divide by this before the sum (None: by the world size).
    gradient_average: False sums the gradients instead of averaging them (divided by a given predivide factor).
    process_group: the DDP group (None: the world).
    """

    reduce_dtype: Optional[torch.dtype] = None
    gradient_predivide_factor: Optional[float] = None
    gradient_average: bool = True
    process_group: Optional[Any] = None

    def factors(self) -> Tuple[float, float]:
        """(divide before the sum, multiply after it). A sum (gradient_average=False) is still divided by a
        given predivide factor, as apex divided it."""
        if not self.gradient_average:
            return float(self.gradient_predivide_factor or 1.0), 1.0
        world = dist.get_world_size(self.process_group)
        pre = float(world if self.gradient_predivide_factor is None else self.gradient_predivide_factor)
        return pre, pre / world


def reduce_hook(config: ReduceConfig, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: pre-divide, all-reduce in `config.reduce_dtype`, post-scale, write back."""
    buffer = bucket.buffer()
    pre, post = config.factors()
    dtype = config.reduce_dtype or buffer.dtype
    widening = dtype != buffer.dtype and torch.finfo(dtype).max > torch.finfo(buffer.dtype).max
    if pre != 1.0 and not widening:
        buffer.div_(pre)
    wire = buffer if dtype == buffer.dtype else buffer.to(dtype)
    if pre != 1.0 and widening:
        wire.div_(pre)
    work = dist.all_reduce(wire, group=config.process_group, async_op=True)

    def finish(fut: torch.futures.Future) -> torch.Tensor:
        reduced = fut.value()[0]
        if post != 1.0 and widening:
            reduced.mul_(post)
        if reduced is not buffer:
            buffer.copy_(reduced)
        if post != 1.0 and not widening:
            buffer.mul_(post)
        return buffer

    return work.get_future().then(finish)
