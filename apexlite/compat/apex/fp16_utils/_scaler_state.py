"""The loss scaler of an FP16_Optimizer checkpoint, as a live apex.amp.scaler.LossScaler.

apex's FP16_Optimizer pickled its scaler object into the state dict: since 2019-02 an
`apex.amp.scaler.LossScaler`, before that an `apex.fp16_utils.loss_scaler.DynamicLossScaler` or
`LossScaler`, whose `loss_scale` is a property, not a method. Both are turned into the scaler
FP16_Optimizer uses now, keeping the saved scale and schedule, so training resumes where it stopped;
anything else is refused when the checkpoint is loaded.
"""
from __future__ import annotations

import math
from typing import Any

from apexlite.amp.scaler import LossScaler as ApexliteLossScaler
from apexlite.compat.apex.amp.scaler import LossScaler
from apexlite.compat.apex.fp16_utils import loss_scaler as old_scalers


def _from_amp_scaler(saved: ApexliteLossScaler) -> LossScaler:
    scaler = LossScaler.__new__(LossScaler)
    scaler.__setstate__(dict(saved.__dict__))
    return scaler


def _from_dynamic(saved: Any) -> LossScaler:
    """The pre-2019 dynamic rule in amp's terms: floor 1, no ceiling, the same doubling point."""
    window = int(saved.scale_window)
    scaler = LossScaler("dynamic", init_scale=float(saved.cur_scale), scale_factor=float(saved.scale_factor),
                        scale_window=window, min_loss_scale=1.0, max_loss_scale=math.inf)
    clean_calls_left = (saved.last_overflow_iter - saved.cur_iter) % window + 1  # until the old rule doubles
    scaler._unskipped = window - clean_calls_left
    return scaler


def restore_loss_scaler(saved: Any) -> LossScaler:
    """A live scaler from the object an FP16_Optimizer state dict holds (see the module docstring)."""
    if isinstance(saved, ApexliteLossScaler):
        return saved if isinstance(saved, LossScaler) else _from_amp_scaler(saved)
    if isinstance(saved, old_scalers.DynamicLossScaler):
        return _from_dynamic(saved)
    if isinstance(saved, old_scalers.LossScaler):
        return LossScaler(float(saved.cur_scale))
    raise TypeError(
        f"FP16_Optimizer.load_state_dict: state_dict['loss_scaler'] is a {type(saved).__module__}."
        f"{type(saved).__qualname__}; expected the loss scaler an FP16_Optimizer saves (apex.amp.scaler.LossScaler, "
        "or apex.fp16_utils.loss_scaler.DynamicLossScaler / LossScaler from pre-2019 apex). Load the checkpoint "
        "with torch.load(..., weights_only=False) under `python -m apexlite run`, so apex's classes resolve.")
