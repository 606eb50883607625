"""Whether a weight holds an fp32 master's value: as it is, or rounded to fp16 or bf16 (an O2 model).

A checkpoint apexlite writes at O2 always has its model weights so; masters that the weights saved beside them
do not hold were kept, never updated, by a run that went on without amp (torch's optimizers keep state keys
they do not know). amp's loads and FusedAdam's both use this to let the loaded weights win then.
"""
from __future__ import annotations

import torch

_ROUNDINGS = (torch.float32, torch.float16, torch.bfloat16)


def holds_master(weight: torch.Tensor, master: torch.Tensor) -> bool:
    """Whether `weight` is `master`, or `master` rounded to fp16 or bf16 (compared in `weight`'s dtype)."""
    return weight.shape == master.shape and any(
        torch.equal(weight, master.to(dtype).to(weight.dtype)) for dtype in _ROUNDINGS)
