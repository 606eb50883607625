"""`initialize`, `deinitialize`, `state_dict`, `load_state_dict` and `master_params`."""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from apexlite.amp import checks
from apexlite.amp.advice import warn_known_traps
from apexlite.amp.amp_optimizer import AmpOptimizer
from apexlite.amp.plain_grads import PlainGrads
from apexlite.amp.checkpoint_convert import check_carried_masters, take_carried_masters
from apexlite.amp.errors import AmpConfigError, AmpUsageError
from apexlite.amp.fused_master import FusedMasterGrads, supports_fused_master_step
from apexlite.amp.handle import AmpHandle
from apexlite.amp.legacy_state import legacy_flags
from apexlite.amp.master import MasterParams
from apexlite.amp.master_copies import stale_masters_note
from apexlite.master_rounding import holds_master
from apexlite.amp.master_sync import MastersFollowLoads
from apexlite.amp.model_cast import cast_model, install_forward_scope, install_io_casts
from apexlite.amp.o1.device_scope import rescope
from apexlite.amp.o1.patches import set_o1_patches
from apexlite.amp.environment import (apply_environment, fit_overrides_to_level, loss_scale_from_environment,
                                      settle_model_dtype)
from apexlite.amp.opt_levels import Properties, banner, resolve_properties
from apexlite.amp.o1.registry import PendingRegistrations
from apexlite.amp.scaler import parse_scaler_state
from apexlite.amp.telemetry_writer import check_report_path
from apexlite.amp.session import (
    DEFAULT_MAX_NONFINITE_LOSSES, AmpSession, ForwardScopeEnd, ForwardScopeStart, SessionOptions, current_session, log,
)
from apexlite.amp.transaction import InitializeTransaction


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
               dtype: Any = None, max_nonfinite_losses: int = DEFAULT_MAX_NONFINITE_LOSSES) -> Any:
    """Set up mixed precision for `models` and `optimizers`; returns them in the shape given.

    Arguments and defaults are apex.amp's. apexlite-only keywords: `dtype` picks the low-precision
    type for every opt level, torch.float16 (default) or torch.bfloat16 (the loss scale then defaults
    to 1.0); `max_nonfinite_losses` stops a run whose loss itself was inf/NaN that many consecutive
    iterations (0: never). May be called again (see the NOTE in apexlite/amp/session.py): the latest call's options
    apply and earlier models and optimizers keep working. All-or-nothing: a failed call changes nothing.
    """
    script_level = opt_level
    enabled = checks.check_enabled(enabled)
    opt_level, low_dtype = apply_environment(opt_level, dtype, enabled)
    loss_scale = loss_scale_from_environment(loss_scale)
    check_report_path()
    checks.check_scalar_arguments(num_losses, verbosity, min_loss_scale, max_loss_scale)
    checks.check_max_nonfinite_losses(max_nonfinite_losses)
    existing = current_session(required=False)
    model_list, models_was_list = _as_list(models)
    optimizer_list, optimizers_was_list = ([], True) if optimizers is None else _as_list(optimizers)
    if not enabled:
        properties = defaults = Properties()
    else:
        checks.check_cast_model_outputs(cast_model_outputs)
        cast_model_type, low_dtype = settle_model_dtype(cast_model_type, dtype, low_dtype)
        overrides = dict(cast_model_type=cast_model_type, patch_torch_functions=patch_torch_functions,
                         keep_batchnorm_fp32=keep_batchnorm_fp32, master_weights=master_weights,
                         loss_scale=loss_scale)
        if opt_level != script_level:
            overrides = fit_overrides_to_level(overrides, opt_level, script_level)
        defaults = resolve_properties(opt_level, low_dtype, {})
        properties = resolve_properties(opt_level, low_dtype, overrides, legacy_flags.hard_override)
        _validate(properties, opt_level, model_list, optimizer_list, min_loss_scale, max_loss_scale, existing)

    options = SessionOptions(properties, low_dtype, verbosity, num_losses, min_loss_scale, max_loss_scale,
                             max_nonfinite_losses)
    session = existing if existing is not None else AmpSession()
    new_models, new_optimizers = (model_list, optimizer_list) if enabled else ([], [])
    transaction = InitializeTransaction(session, new_models, new_optimizers)
    try:
        session.configure(options)
        if enabled:
            session.info(banner(opt_level, defaults, properties))
            _register(session, transaction, new_models, new_optimizers, cast_model_outputs)
        registrations = PendingRegistrations.take() if properties.patch_torch_functions else []
        transaction.taken_registrations = registrations
        set_o1_patches(session, bool(properties.patch_torch_functions), registrations)
        _install_forward_scopes(session)
        if properties.patch_torch_functions:
            rescope(session)  # NOTE [device scope]
        session.handle = _o1_handle(session) if properties.patch_torch_functions else None
    except BaseException:
        transaction.rollback()
        if existing is None:
            session.close()
        raise
    session.own_weights(new_models, new_optimizers)
    session.stats.amp_enabled = bool(enabled)
    session.publish()
    if enabled:
        warn_known_traps(properties, new_optimizers, low_dtype, new_models, advise=verbosity >= 1)
    if existing is not None:
        session.info("amp.initialize called again: opt_level=%s now applies; %d model(s) and %d optimizer(s) "
                 "are registered and share %d new loss scaler(s) (session %s; amp.deinitialize() starts over)",
                 properties.opt_level, len(session.models), len(session.optimizers), len(session.loss_scalers),
                 "extended" if new_models or new_optimizers else "replaced")
    if optimizers is None:
        return models
    return (models if models_was_list else model_list[0],
            optimizers if optimizers_was_list else optimizer_list[0])


def _validate(properties: Properties, opt_level: str, model_list: List[Any], optimizer_list: List[Any],
              min_loss_scale: Optional[float], max_loss_scale: float, existing: Optional[AmpSession]) -> None:
    """Every check that can fail before anything is cast or patched."""
    checks.check_initial_scale(properties, min_loss_scale, max_loss_scale)
    checks.check_models(model_list)
    checks.check_optimizers(optimizer_list)
    check_carried_masters(optimizer_list, model_list)
    checks.check_sharded_models(model_list, opt_level, properties)
    checks.check_sharded_optimizers(optimizer_list, opt_level, properties)
    registered = existing.models.items() if existing is not None else []
    checks.check_models_not_recast(model_list, registered, properties)
    if not legacy_flags.allow_incoming_model_not_fp32:
        checks.check_params_fp32(model_list, properties)
    checks.check_no_float64(model_list, properties)
    if properties.cast_model_type:
        checks.check_optimizer_params_in_models(optimizer_list, [*model_list, *registered])
    if properties.master_weights:
        checks.check_unique_params(optimizer_list)


def _register(session: AmpSession, transaction: InitializeTransaction, model_list: List[Any],
              optimizer_list: List[Any], cast_model_outputs: Optional[torch.dtype]) -> None:
    """Cast the models, then wrap each optimizer with the grad strategy its properties call for."""
    properties = session.properties
    fp32_sources = {}
    for model in model_list:
        if properties.cast_model_type:
            fp32_sources.update(cast_model(model, session.patcher, properties.cast_model_type,
                                           properties.keep_batchnorm_fp32, cast_model_outputs,
                                           transaction.model_undo))
        elif cast_model_outputs is not None:
            install_io_casts(model, session.patcher, None, cast_model_outputs)
    for model in model_list:
        session.models.add(model)
        if properties.master_weights:  # a load_state_dict later must reach the masters (master_sync.py)
            follow = MastersFollowLoads(session)
            for module in model.modules():
                session.patcher.add_handle(module._register_load_state_dict_pre_hook(follow.read, with_module=True),
                                           "load_state_dict pre-hook (O2 masters follow)", owner=module)
                session.patcher.add_handle(module.register_load_state_dict_post_hook(follow),
                                           "load_state_dict post-hook (O2 masters follow)", owner=module)
    for optimizer in optimizer_list:
        if properties.cast_model_type and not properties.master_weights and _recast_state(optimizer):
            session.info("cast the optimizer state %s held before amp.initialize to its params' dtype",
                         type(optimizer).__name__)
        carried = take_carried_masters(optimizer, model_list)
        _restore_carried_masters(optimizer, carried, fp32_sources if properties.master_weights else None)
        if carried:
            session.info("restored %d fp32 master weight(s) that %s loaded before amp.initialize", len(carried),
                         type(optimizer).__name__)
        grads = _grad_strategy(session, optimizer, properties.master_weights, fp32_sources, bool(carried))
        amp_optimizer = AmpOptimizer(optimizer, session, grads)
        session.optimizers[id(optimizer)] = amp_optimizer
        amp_optimizer.install()
    fp32_sources.clear()  # the grad strategies took what they need (MasterParams: until the first backward)
    if model_list or optimizer_list:
        session.from_initialize = True


def _recast_state(optimizer: Any) -> bool:
    """State loaded before initialize (a resume) follows its params into the cast dtype, as a load after
    initialize would: the optimizer reloads its own state_dict, which casts it to each param's dtype. Returns
    whether there was state to cast."""
    if any(optimizer.state.values()):
        optimizer.load_state_dict(optimizer.state_dict())
        return True
    return False


def _restore_carried_masters(optimizer: Any, carried: List[Any], fp32_sources: Optional[Dict[Any, Any]]) -> None:
    """An O2 checkpoint loaded before initialize: its masters seed the new masters (when this run keeps
    them) and the params take their values, as a load after initialize does (NOTE in checkpoint_convert.py)."""
    if not carried:
        return
    stale = 0
    with torch.no_grad():
        for param, master in carried:
            if not holds_master(param, master):
                stale += 1  # the loaded weights are from another step than the masters: the weights win
                continue
            param.copy_(master)
            if fp32_sources is not None and param.dtype != torch.float32:
                fp32_sources[param] = master
    if stale:
        log.warning(stale_masters_note(stale, len(carried), type(optimizer).__name__))


def _install_forward_scopes(session: AmpSession) -> None:
    """Under O1, the end of each registered model's outermost forward drops its weight casts."""
    if not session.patches_torch:
        return
    for model in session.models:
        if model not in session.scoped_models:
            install_forward_scope(model, session.patcher, ForwardScopeStart(), ForwardScopeEnd())
            session.scoped_models.add(model)


def _o1_handle(session: AmpSession) -> Any:
    return session.handle if isinstance(session.handle, AmpHandle) else AmpHandle(session)


def _grad_strategy(session: AmpSession, optimizer: Any, master_weights: bool,
                   fp32_sources: Dict[torch.Tensor, torch.Tensor], carried: bool) -> Any:
    """How this optimizer's grads are handled: plain, separate fp32 masters, or masters inside a fused step
    (`carried`: the masters come from a checkpoint loaded before initialize, master_sync.py)."""
    if not master_weights:
        return PlainGrads(optimizer, models_fn=session.models.items)
    if supports_fused_master_step(optimizer):
        return FusedMasterGrads(optimizer, fp32_sources, carried)
    return MasterParams(optimizer, fp32_sources, carried)


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


SCALER_KEY = re.compile(r"loss_scaler(\d+)$")
STATE_FORMAT = "{'loss_scaler0': {'loss_scale': 65536.0, 'unskipped': 0}, 'loss_scaler1': ...} (amp.state_dict())"


def load_state_dict(state: Any) -> None:
    """Restore loss scalers from `amp.state_dict()` output (apex's format) or a torch GradScaler dict.

    Validated as a whole before any scaler changes: a rejected dict leaves every scaler as it was.
    Entries map to scalers by the index in their key (`loss_scaler1` -> loss_id 1).
    """
    session = current_session(message="amp.load_state_dict() needs an initialized session: call amp.initialize first.")
    scalers = session.loss_scalers
    if not isinstance(state, dict):
        raise AmpConfigError(f"amp.load_state_dict expects a dict like {STATE_FORMAT}; got {type(state).__name__}.")
    if "scale" in state and "_growth_tracker" in state:  # one torch GradScaler state for every loss
        parsed = parse_scaler_state(state, session.options.max_loss_scale, "GradScaler state")
        updates = [(scaler, parsed) for scaler in scalers]
    else:
        updates = _scaler_updates(state, scalers, session.options.max_loss_scale)
    for scaler, (scale, unskipped) in updates:
        scaler.restore(scale, unskipped)


def _scaler_updates(state: dict, scalers: List[Any], max_loss_scale: float) -> List[Tuple[Any, Tuple[float, int]]]:
    unexpected = [key for key in state if not (isinstance(key, str) and "loss_scaler" in key)]
    if unexpected:
        raise AmpConfigError(
            "Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
            + ", ".join(f'"{key}"' for key in unexpected) + f". Expected {STATE_FORMAT}."
        )
    if len(state) != len(scalers):
        log.warning("amp state_dict contains %d entries, while %d loss_scalers are used", len(state), len(scalers))
    matches = [SCALER_KEY.match(key) for key in state]
    indices = ([int(m.group(1)) for m in matches] if all(matches) else list(range(len(state))))
    updates = []
    for index, key in zip(indices, state):
        parsed = parse_scaler_state(state[key], max_loss_scale, f"amp state_dict[{key!r}]")
        if index >= len(scalers):
            log.warning("Skipping loss_scaler[%d], since num_losses was set to %d", index, len(scalers))
            continue
        updates.append((scalers[index], parsed))
    return updates


def master_params(optimizer: Any) -> Iterator[torch.Tensor]:
    """The params `optimizer` steps: fp32 masters (and fp32 model params) under O2, else the model's.

    Under O2 their grads are unscaled fp32 values, ready for clipping.
    """
    if not hasattr(optimizer, "param_groups"):
        raise AmpUsageError(f"amp.master_params takes one optimizer (what amp.initialize returned); got "
                            f"{type(optimizer).__name__}" + (": call it once per optimizer" if isinstance(
                                optimizer, (list, tuple)) else "") + ".")
    session = current_session(required=False)
    amp_optimizer = session.amp_optimizer(optimizer, required=False) if session is not None else None
    if isinstance(getattr(amp_optimizer, "grads", None), FusedMasterGrads):
        yield from amp_optimizer.grads.master_params()
        return
    for group in optimizer.param_groups:
        yield from group["params"]
