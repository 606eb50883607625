"""`apex.amp.scaler`: the loss scaler and apex's two pure-Python grad copy helpers."""
from __future__ import annotations

import math

import torch

from apexlite.amp.scaler import LossScaler  # noqa: F401
from apexlite.compat import generic


def _non_finite(tensor: torch.Tensor) -> bool:
    total = float(tensor.float().sum())
    return math.isinf(total) or math.isnan(total)


def scale_check_overflow_python(model_grad: torch.Tensor, master_grad: torch.Tensor, scale: float,
                                check_overflow: bool = False) -> bool:
    """master_grad = model_grad * scale; returns True (and copies nothing) when model_grad has inf/NaN."""
    if check_overflow and _non_finite(model_grad):
        return True
    if master_grad is not model_grad:
        master_grad.copy_(model_grad)
    if scale != 1.0:
        master_grad.mul_(scale)
    return False


def axpby_check_overflow_python(model_grad: torch.Tensor, stashed_grad: torch.Tensor,
                                master_grad: torch.Tensor, a: float, b: float,
                                check_overflow: bool = False) -> bool:
    """master_grad = a*model_grad + b*stashed_grad; returns True when model_grad has inf/NaN."""
    if check_overflow and _non_finite(model_grad):
        return True
    master_grad.data = a * model_grad.to(master_grad.dtype) + b * stashed_grad.to(master_grad.dtype)
    return False

__getattr__ = generic.fallback_getattr(__name__)
