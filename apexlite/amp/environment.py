"""The switches that let an unchanged script change its mixed precision from the environment, and dtype names.

`APEXLITE_OPT_LEVEL` and `APEXLITE_DTYPE` override `initialize`'s opt level and dtype (and `amp.init`'s
dtype); `APEXLITE_LOSS_SCALE` its loss scale. Each override is logged where it applies. This module
imports nothing of the frontend or the handle, which both read it.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpConfigError
from apexlite.amp.opt_levels import LOW_PRECISION_DTYPES, OPT_LEVELS, applies_at, unknown_opt_level_message

log = get_logger("amp")

OPT_LEVEL_ENV = "APEXLITE_OPT_LEVEL"
DTYPE_ENV = "APEXLITE_DTYPE"
LOSS_SCALE_ENV = "APEXLITE_LOSS_SCALE"
DTYPE_NAMES = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(value: Any, source: str = "dtype") -> torch.dtype:
    """torch.float16/bfloat16 or one of their names; anything else is a clear error."""
    if value in LOW_PRECISION_DTYPES:
        return value
    name = str(value).replace("torch.", "").lower()
    if name in DTYPE_NAMES:
        return DTYPE_NAMES[name]
    raise AmpConfigError(
        f"{source} must be torch.float16 or torch.bfloat16 (or 'float16'/'bfloat16'); got {value!r}."
    )


def apply_environment(opt_level: Any, dtype: Any, enabled: bool = True) -> Tuple[Any, torch.dtype]:
    """APEXLITE_OPT_LEVEL / APEXLITE_DTYPE let unchanged scripts switch level or dtype. A call with
    enabled=False turns amp off whatever they say: logged as such, not as an override."""
    env_level = os.environ.get(OPT_LEVEL_ENV)
    env_dtype = os.environ.get(DTYPE_ENV)
    if env_level and env_level not in OPT_LEVELS:
        raise AmpConfigError(f"{OPT_LEVEL_ENV}: " + unknown_opt_level_message(env_level))
    if not enabled and (env_level or env_dtype):
        set_names = " and ".join(f"{name}={value}" for name, value in ((OPT_LEVEL_ENV, env_level), (DTYPE_ENV, env_dtype))
                                 if value)
        log.info("%s ignored: the script called amp.initialize(..., enabled=False), so amp is off "
                 "(the script's own switch turns it on)", set_names)
    if env_level:
        if env_level != opt_level and enabled:
            log.info("%s=%s overrides opt_level=%r", OPT_LEVEL_ENV, env_level, opt_level)
        opt_level = env_level
    if env_dtype:
        parsed = parse_dtype(env_dtype, DTYPE_ENV)
        if enabled:
            log.info("%s=%s selects the low-precision dtype %s", DTYPE_ENV, env_dtype, parsed)
            if parsed is torch.bfloat16 and not os.environ.get(LOSS_SCALE_ENV):
                log.info("%s=%s: the opt levels' default loss scale is then 1.0 (bfloat16 has float32's range), "
                         "which checks nothing, so a step with inf/NaN grads is no longer skipped; %s=dynamic keeps "
                         "the check", DTYPE_ENV, env_dtype, LOSS_SCALE_ENV)
        return opt_level, parsed
    return opt_level, parse_dtype(torch.float16 if dtype is None else dtype)


def fit_overrides_to_level(overrides: Dict[str, Any], level: str, script_level: Any) -> Dict[str, Any]:
    """The script's options without those APEXLITE_OPT_LEVEL's level refuses (keep_batchnorm_fp32=True written
    for O2, run at O1: apex would refuse the pair, but the script never asked for it), each left out with a log
    line; the others unchanged."""
    kept = dict(overrides)
    for name, value in overrides.items():
        if not applies_at(name, value, level):
            log.info("%s=%s: the script's %s=%r (written for opt_level=%r) does not apply at %s and is left out",
                     OPT_LEVEL_ENV, level, name, value, script_level, level)
            kept[name] = None
    return kept


def loss_scale_from_environment(loss_scale: Any) -> Any:
    """APEXLITE_LOSS_SCALE=N|dynamic replaces the script's loss_scale for every loss (`migrate --verify` runs
    the original under one static scale this way)."""
    env_scale = os.environ.get(LOSS_SCALE_ENV, "").strip()
    if not env_scale:
        return loss_scale
    if env_scale != "dynamic":
        try:
            valid = 0 < float(env_scale) < float("inf")
        except ValueError:
            valid = False
        if not valid:
            raise AmpConfigError(f"{LOSS_SCALE_ENV} must be 'dynamic' or a finite number > 0; got {env_scale!r}. "
                                 "Unset it or fix it.")
    log.info("%s=%s overrides loss_scale=%r", LOSS_SCALE_ENV, env_scale, loss_scale)
    return env_scale


def settle_model_dtype(cast_model_type: Any, dtype: Any, low_dtype: torch.dtype) -> Tuple[Any, torch.dtype]:
    """A low-precision `cast_model_type` and the session's dtype (which picks the loss scale) must name one
    dtype: APEXLITE_DTYPE replaces both (logged); the script's own `dtype=` and `cast_model_type=` that
    disagree are refused; `cast_model_type` alone sets the dtype. Returns both, settled."""
    if cast_model_type not in LOW_PRECISION_DTYPES or cast_model_type == low_dtype:
        return cast_model_type, low_dtype
    if os.environ.get(DTYPE_ENV):
        log.info("%s=%s also replaces the script's cast_model_type=%s", DTYPE_ENV, os.environ[DTYPE_ENV],
                 cast_model_type)
        return low_dtype, low_dtype
    if dtype is not None:
        raise AmpConfigError(f"cast_model_type={cast_model_type} and dtype={low_dtype} disagree: the model would be "
                             f"cast to one while the loss scale is chosen for the other. Pass dtype= alone (it sets "
                             "the model's type at O2/O3 too), or make them the same.")
    return cast_model_type, cast_model_type
