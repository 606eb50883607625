"""`initialize`, `deinitialize`, `state_dict`, `load_state_dict` and `master_params`."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from apexlite.amp import checks
from apexlite.amp.amp_optimizer import AmpOptimizer, PlainGrads
from apexlite.amp.errors import AmpConfigError
from apexlite.amp.fused_master import FusedMasterGrads, supports_fused_master_step
from apexlite.amp.legacy_state import legacy_flags
from apexlite.amp.master import MasterParams
from apexlite.amp.model_cast import cast_model, install_io_casts
from apexlite.amp import o1_patches
from apexlite.amp.opt_levels import (
    LOW_PRECISION_DTYPES, OPT_LEVELS, Properties, banner, resolve_properties,
    unknown_opt_level_message,
)
from apexlite.amp.registry import PendingRegistrations
from apexlite.amp.session import AmpSession, current_session, log

OPT_LEVEL_ENV = "APEXLITE_OPT_LEVEL"
DTYPE_ENV = "APEXLITE_DTYPE"
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


def _apply_environment(opt_level: Any, dtype: Any) -> Tuple[Any, torch.dtype]:
    """APEXLITE_OPT_LEVEL / APEXLITE_DTYPE let unchanged scripts switch level or dtype."""
    env_level = os.environ.get(OPT_LEVEL_ENV)
    if env_level:
        if env_level not in OPT_LEVELS:
            raise AmpConfigError(f"{OPT_LEVEL_ENV}: " + unknown_opt_level_message(env_level))
        if env_level != opt_level:
            log.info("%s=%s overrides opt_level=%r", OPT_LEVEL_ENV, env_level, opt_level)
        opt_level = env_level
    env_dtype = os.environ.get(DTYPE_ENV)
    if env_dtype:
        parsed = parse_dtype(env_dtype, DTYPE_ENV)
        log.info("%s=%s selects the low-precision dtype %s", DTYPE_ENV, env_dtype, parsed)
        return opt_level, parsed
    return opt_level, parse_dtype(torch.float16 if dtype is None else dtype)


def _as_list(value: Any) -> Tuple[List[Any], bool]:
    """(items, whether the caller passed a list) so results come back in the caller's shape."""
    if isinstance(value, list):
        return value, True
    return [value], False


def initialize(models: Any, optimizers: Any = None, enabled: bool = True, opt_level: str = "O1",
               cast_model_type: Any = None, patch_torch_functions: Optional[bool] = None,
               keep_batchnorm_fp32: Any = None, master_weights: Optional[bool] = None, loss_scale: Any = None,
               cast_model_outputs: Optional[torch.dtype] = None, num_losses: int = 1, verbosity: int = 1,
               min_loss_scale: Optional[float] = None, max_loss_scale: float = 2.0 ** 24, *,
               dtype: Any = None) -> Any:
    """Set up mixed precision for `models` and `optimizers`; returns them in the shape given.

    Arguments and defaults are apex.amp's. `dtype` (apexlite only) picks the low-precision type for
    every opt level: torch.float16 (default) or torch.bfloat16; with bfloat16 the loss scale defaults
    to 1.0. Call once per process, or `deinitialize()` before calling again.
    """
    opt_level, low_dtype = _apply_environment(opt_level, dtype)
    checks.check_scalar_arguments(num_losses, verbosity, min_loss_scale, max_loss_scale)
    AmpSession.ensure_none_active()
    if not enabled:
        AmpSession(Properties(), low_dtype, verbosity, num_losses, min_loss_scale, max_loss_scale)
        return models if optimizers is None else (models, optimizers)

    overrides = dict(cast_model_type=cast_model_type, patch_torch_functions=patch_torch_functions,
                     keep_batchnorm_fp32=keep_batchnorm_fp32, master_weights=master_weights,
                     loss_scale=loss_scale)
    defaults = resolve_properties(opt_level, low_dtype, {})
    properties = resolve_properties(opt_level, low_dtype, overrides)
    model_list, models_was_list = _as_list(models)
    optimizer_list, optimizers_was_list = ([], True) if optimizers is None else _as_list(optimizers)
    checks.check_models(model_list)
    checks.check_optimizers(optimizer_list)
    checks.check_sharded_models(model_list, opt_level, properties)
    if not legacy_flags.allow_incoming_model_not_fp32:
        checks.check_params_fp32(model_list, properties)
    if properties.cast_model_type:
        checks.check_optimizer_params_in_models(optimizer_list, model_list)

    session = AmpSession(properties, low_dtype, verbosity, num_losses, min_loss_scale, max_loss_scale)
    try:
        session.info(banner(opt_level, defaults, properties))
        fp32_sources = {}
        for model in model_list:
            if properties.cast_model_type:
                fp32_sources.update(cast_model(model, session.patcher, properties.cast_model_type,
                                               properties.keep_batchnorm_fp32, cast_model_outputs))
            elif cast_model_outputs is not None:
                install_io_casts(model, session.patcher, None, cast_model_outputs)
        session.models.extend(model_list)
        for optimizer in optimizer_list:
            grads = _grad_strategy(optimizer, properties.master_weights, fp32_sources)
            amp_optimizer = AmpOptimizer(optimizer, session, grads)
            amp_optimizer.install()
            session.optimizers[id(optimizer)] = amp_optimizer
        if properties.patch_torch_functions:
            o1_patches.patch_torch_functions(session, PendingRegistrations.take())
    except BaseException:
        session.close()
        raise

    if optimizers is None:
        return models
    return (models if models_was_list else model_list[0],
            optimizers if optimizers_was_list else optimizer_list[0])


def _grad_strategy(optimizer: Any, master_weights: bool, fp32_sources: Dict[torch.Tensor, torch.Tensor]) -> Any:
    """How this optimizer's grads are handled: plain, separate fp32 masters, or masters inside a fused step."""
    if not master_weights:
        return PlainGrads(optimizer)
    if supports_fused_master_step(optimizer):
        return FusedMasterGrads(optimizer, fp32_sources)
    return MasterParams(optimizer, fp32_sources)


def deinitialize() -> None:
    """Undo every patch and reset all amp state so `initialize` can run again. Idempotent.

    Models cast by O2/O3 stay in their cast dtype; O2 optimizers get the model params back in their
    param groups (with the fp32 optimizer state).
    """
    session = current_session(required=False)
    if session is not None:
        session.close()


def state_dict(destination: Optional[dict] = None) -> dict:
    """Loss-scaler state in apex's format: {"loss_scaler0": {"loss_scale": ..., "unskipped": ...}, ...}."""
    session = current_session(message="amp.state_dict() needs an initialized session: call amp.initialize first.")
    destination = OrderedDict() if destination is None else destination
    for index, scaler in enumerate(session.loss_scalers):
        destination[f"loss_scaler{index}"] = scaler.state_dict()
    return destination


def load_state_dict(state: dict) -> None:
    """Restore loss scalers from `amp.state_dict()` output (apex's format) or a torch GradScaler dict."""
    session = current_session(message="amp.load_state_dict() needs an initialized session: call amp.initialize first.")
    scalers = session.loss_scalers
    if "scale" in state and "_growth_tracker" in state:
        for scaler in scalers:
            scaler.load_state_dict(state)
        return
    if len(state) != len(scalers):
        log.warning("amp state_dict contains %d entries, while %d loss_scalers are used", len(state), len(scalers))
    unexpected = [key for key in state if "loss_scaler" not in key]
    if unexpected:
        raise AmpConfigError(
            "Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
            + ", ".join(f'"{key}"' for key in unexpected) + ". Expected keys 'loss_scaler0', 'loss_scaler1', ..."
        )
    for index, key in enumerate(key for key in state if "loss_scaler" in key):
        if index >= len(scalers):
            log.warning("Skipping loss_scaler[%d], since num_losses was set to %d", index, len(scalers))
            break
        scalers[index].load_state_dict(state[key])


def master_params(optimizer: Any) -> Iterator[torch.Tensor]:
    """The params `optimizer` steps: fp32 masters (and fp32 model params) under O2, else the model's.

    Under O2 their grads are unscaled fp32 values, ready for clipping.
    """
    session = current_session(required=False)
    amp_optimizer = session.amp_optimizer(optimizer, required=False) if session is not None else None
    if isinstance(getattr(amp_optimizer, "grads", None), FusedMasterGrads):
        yield from amp_optimizer.grads.master_params()
        return
    for group in optimizer.param_groups:
        yield from group["params"]
