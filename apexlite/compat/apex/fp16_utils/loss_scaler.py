"""`apex.fp16_utils.loss_scaler`: the old standalone loss scalers (not amp's LossScaler).

Scripts that do manual fp16 training call `scaler.backward(loss)`, then `scaler.has_overflow(params)`
and `scaler.update_scale(overflow)`, and divide the gradients by `scaler.loss_scale` themselves.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Tuple

import torch

from apexlite.compat import generic
from apexlite.compat.apex.fp16_utils.fp16util import to_python_float  # noqa: F401  (also defined here in apex)


def _has_inf_or_nan(x: torch.Tensor) -> bool:
    """True when the tensor holds inf or NaN (one host sync)."""
    total = float(x.float().sum())
    return math.isinf(total) or math.isnan(total)


def _grads_overflow(params: Iterable[torch.Tensor]) -> bool:
    return any(param.grad is not None and _has_inf_or_nan(param.grad) for param in params)


class _ScalerBase:
    """What both old scalers share: the scaled backward and apex's gradient-scaling module hook."""

    cur_scale: float

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def scale_gradient(self, module: Any, grad_in: Tuple[torch.Tensor, ...], grad_out: Any) -> Tuple[torch.Tensor, ...]:
        """A backward hook that multiplies the incoming gradients by the loss scale."""
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


class LossScaler(_ScalerBase):
    """A fixed loss scale: never reports an overflow and never changes."""

    def __init__(self, scale: float = 1) -> None:
        self.cur_scale = scale

    def has_overflow(self, params: Iterable[torch.Tensor]) -> bool:
        return False

    def update_scale(self, overflow: bool) -> None:
        """A static scale does not move."""


class DynamicLossScaler(_ScalerBase):
    """Halve the scale (not below 1) on overflow; double it after `scale_window` clean iterations."""

    def __init__(self, init_scale: float = 2 ** 32, scale_factor: float = 2.0, scale_window: int = 1000) -> None:
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    _has_inf_or_nan = staticmethod(_has_inf_or_nan)

    def has_overflow(self, params: Iterable[torch.Tensor]) -> bool:
        """True when any gradient holds inf or NaN (one host sync per gradient)."""
        return _grads_overflow(params)

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1


__getattr__ = generic.fallback_getattr(__name__)
