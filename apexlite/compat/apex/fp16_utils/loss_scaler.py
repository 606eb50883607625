"""`apex.fp16_utils.loss_scaler`: the old standalone loss scalers (not amp's LossScaler).

Scripts that do manual fp16 training call `scaler.backward(loss)`, then `scaler.has_overflow(params)`
and `scaler.update_scale(overflow)`, and divide the gradients by `scaler.loss_scale` themselves.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch

from apexlite.compat import generic
from apexlite.compat.apex.fp16_utils.fp16util import to_python_float  # noqa: F401  (apex's module has one)


def _grads_overflow(params: Iterable[torch.Tensor]) -> bool:
    for param in params:
        if param.grad is not None:
            total = float(param.grad.float().sum())
            if math.isinf(total) or math.isnan(total):
                return True
    return False


class LossScaler:
    """A fixed loss scale: never reports an overflow and never changes."""

    def __init__(self, scale: float = 1) -> None:
        self.cur_scale = scale

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def has_overflow(self, params: Iterable[torch.Tensor]) -> bool:
        return False

    def update_scale(self, overflow: bool) -> None:
        """A static scale does not move."""

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


class DynamicLossScaler:
    """Halve the scale (not below 1) on overflow; double it after `scale_window` clean iterations."""

    def __init__(self, init_scale: float = 2 ** 32, scale_factor: float = 2.0, scale_window: int = 1000) -> None:
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

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

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


__getattr__ = generic.fallback_getattr(__name__)
