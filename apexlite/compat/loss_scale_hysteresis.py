"""`amp_C.update_scale_hysteresis`: a dynamic loss-scale update that tolerates a few overflows.

This is torch.amp.GradScaler's growth/backoff rule with one addition (used by Megatron-style
trainers): an overflowing step only lowers the scale once `hysteresis` overflows have been seen
since the last clean step. Everything stays on the tensors' device (no host sync), as in apex.
"""
from __future__ import annotations

import torch

_SMALLEST_NORMAL_FP32 = torch.finfo(torch.float32).tiny


def _check_state(current_scale: torch.Tensor, growth_tracker: torch.Tensor, hysteresis_tracker: torch.Tensor,
                 found_inf: torch.Tensor) -> None:
    named = {"current_scale": current_scale, "growth_tracker": growth_tracker,
             "hysteresis_tracker": hysteresis_tracker, "found_inf": found_inf}
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            raise ValueError(f"update_scale_hysteresis: {name} must be a one-element tensor "
                             f"(e.g. torch.tensor([x], device='cuda')); got {tensor!r}.")
    if current_scale.dtype != torch.float32:
        raise TypeError(f"update_scale_hysteresis: current_scale must be float32 (as apex's kernel reads it); "
                        f"got {current_scale.dtype}.")
    for name in ("growth_tracker", "hysteresis_tracker"):
        if named[name].dtype.is_floating_point or named[name].dtype == torch.bool:
            raise TypeError(f"update_scale_hysteresis: {name} must be an integer tensor (torch.int32 in apex); "
                            f"got {named[name].dtype}.")


@torch.no_grad()
def update_scale_hysteresis(current_scale: torch.Tensor, growth_tracker: torch.Tensor,
                            hysteresis_tracker: torch.Tensor, found_inf: torch.Tensor, growth_factor: float,
                            backoff_factor: float, growth_interval: int, hysteresis: int) -> torch.Tensor:
    """Update the three state tensors in place for one step; returns `current_scale`, as apex did.

    A step with `found_inf > 0` counts the hysteresis tracker down; while it stays above zero only the
    growth tracker is reset. Otherwise an overflowing (non-zero `found_inf`) step multiplies the scale by
    `backoff_factor` (a result below fp32's smallest normal becomes 0, as apex's flush-to-zero kernel
    gives) and resets the growth tracker. A clean step counts the growth tracker up and, on reaching
    `growth_interval`, multiplies the scale by `growth_factor` unless that overflows fp32, then resets
    it; every step with `found_inf <= 0` resets the hysteresis tracker to `hysteresis`.
    """
    _check_state(current_scale, growth_tracker, hysteresis_tracker, found_inf)
    scale, growth, hysteresis_count = current_scale.view(1), growth_tracker.view(1), hysteresis_tracker.view(1)
    found_inf = found_inf.to(current_scale.device).view(1)
    positive, nonzero = found_inf > 0, found_inf != 0
    hysteresis_left = hysteresis_count - positive.to(hysteresis_count.dtype)
    held = positive & (hysteresis_left > 0)
    backoff = nonzero & ~held
    successful = growth + 1
    grow = ~nonzero & (successful == growth_interval)

    backed_off = (scale.double() * backoff_factor).float()
    backed_off = torch.where(backed_off.abs() < _SMALLEST_NORMAL_FP32, torch.zeros_like(backed_off), backed_off)
    grown = (scale.double() * growth_factor).float()
    grown = torch.where(torch.isfinite(grown), grown, scale)

    new_scale = torch.where(backoff, backed_off, torch.where(grow, grown, scale))
    new_growth = torch.where(nonzero | grow, torch.zeros_like(successful), successful)
    new_hysteresis = torch.where(found_inf <= 0, torch.full_like(hysteresis_left, hysteresis), hysteresis_left)
    scale.copy_(new_scale)
    growth.copy_(new_growth)
    hysteresis_count.copy_(new_hysteresis)
    return current_scale
