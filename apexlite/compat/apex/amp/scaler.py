"""`apex.amp.scaler`: the loss scaler and apex's two pure-Python grad copy helpers.

`LossScaler` is apexlite's (apexlite.amp.scaler) with what apex's class also had: its class
attributes, `unscale(model_grads, master_grads, ...)` (apex's form, which copies into master grads)
and unpickling of apex-written objects, whose attributes (dynamic, _loss_scale, _unskipped,
_scale_seq_len, _min_loss_scale, _max_loss_scale, ...) become a complete apexlite scaler.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Optional, Sequence

import torch

from apexlite.compat import generic
from apexlite.amp.scaler import LossScaler as _LossScaler
from apexlite.amp.unscale import unscale_and_check

# apex-only attributes a pickled apex scaler carries and apexlite has no use for
_APEX_ONLY = ("_overflow_buf",)


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


class LossScaler(_LossScaler):
    """apexlite's loss scaler under apex's name (see the module docstring)."""

    warned_no_fused_kernel = False
    warned_unscaling_non_fp32_grad = False
    has_fused_kernel = True

    def unscale(self, model_grads: Iterable[torch.Tensor], master_grads: Optional[Sequence[torch.Tensor]] = None,
                unused_scale: Any = None, models_are_masters: bool = False,
                scale_override: Optional[float] = None) -> None:
        """With ``master_grads`` (apex's form): master = model / scale, flagging inf/NaN; without: unscale in place."""
        if master_grads is None:
            super().unscale(model_grads)
            return
        if self._has_overflow:
            return
        scale = self._loss_scale if scale_override is None else scale_override
        if scale == 1.0 and models_are_masters and not self.dynamic:
            return
        masters = []
        for model, master in zip(model_grads, master_grads):
            if model is None:
                continue
            if master is not model:
                master.copy_(model)
            masters.append(master)
        if masters and (self.checks_overflow or scale != 1.0):
            unscale_and_check(masters, 1.0 / scale, self._found_inf)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """Restores apexlite's pickles and apex's (apex's attribute set, completed with apexlite's defaults)."""
        if "_loss_scale" not in state:
            raise RuntimeError("this pickled apex.amp.scaler.LossScaler has no _loss_scale attribute; it is not a "
                               f"loss scaler apex or apexlite wrote (attributes: {sorted(state)}).")
        scale = state["_loss_scale"]
        if isinstance(scale, torch.Tensor) and scale.numel() == 1:
            scale = scale.item()
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise RuntimeError(f"this pickled apex.amp.scaler.LossScaler holds loss scale {scale!r}; a loss scale "
                               "must be a finite number > 0, so this checkpoint cannot resume training.")
        dynamic = bool(state.get("dynamic", False))
        defaults = _LossScaler("dynamic" if dynamic else float(scale), init_scale=float(scale),
                               scale_window=int(state.get("_scale_seq_len", 2000)),
                               min_loss_scale=state.get("_min_loss_scale"),
                               max_loss_scale=float(state.get("_max_loss_scale", 2.0 ** 24)))
        self.__dict__.update(defaults.__dict__)
        self.__dict__.update({key: value for key, value in state.items() if key not in _APEX_ONLY})
        self._loss_scale = float(scale)
        self._unskipped = int(state.get("_unskipped", 0))
        self._has_overflow = bool(state.get("_has_overflow", False))


__getattr__ = generic.fallback_getattr(__name__)
