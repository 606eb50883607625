"""Validation of what `initialize` receives; every error names the problem and the fix."""
from __future__ import annotations

import inspect
import numbers
from typing import Any, List, Optional

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpConfigError, AmpUsageError
from apexlite.amp.opt_levels import Properties

log = get_logger("amp")
_PARALLEL_WRAPPERS = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)


def check_cast_model_outputs(value: Any) -> None:
    """None, or the floating torch.dtype every model output is cast to (apex took the dtype object only)."""
    if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
        raise AmpConfigError(f"cast_model_outputs must be a floating torch.dtype such as torch.float32, or None; got "
                             f"{value!r}" + (f" (write torch.{value})" if isinstance(value, str) else "") + ".")


def check_scalar_arguments(num_losses: Any, verbosity: Any, min_loss_scale: Any, max_loss_scale: Any) -> None:
    if not isinstance(num_losses, int) or isinstance(num_losses, bool) or num_losses < 1:
        raise AmpConfigError(f"num_losses must be an int >= 1 (one loss scaler per loss_id); got {num_losses!r}.")
    if not isinstance(verbosity, int) or isinstance(verbosity, bool) or verbosity < 0:
        raise AmpConfigError(f"verbosity must be 0, 1 or 2; got {verbosity!r}.")
    if min_loss_scale is not None and not (_is_number(min_loss_scale) and min_loss_scale >= 0):
        raise AmpConfigError(f"min_loss_scale must be None or a number >= 0; got {min_loss_scale!r}.")
    if not (_is_number(max_loss_scale) and max_loss_scale > 0):
        raise AmpConfigError(f"max_loss_scale must be a number > 0 (apex's default: 2.**24); got {max_loss_scale!r}.")
    if min_loss_scale and min_loss_scale > max_loss_scale:
        raise AmpConfigError(
            f"min_loss_scale ({min_loss_scale}) must not exceed max_loss_scale ({max_loss_scale})."
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's floats too


def check_enabled(enabled: Any) -> bool:
    """`enabled` as a bool: True/False, or the strings "True"/"False" an argparse flag or a config file gives
    (any other string, "False" included before, would have been truthy and turned amp on)."""
    if enabled is None or type(enabled).__name__ in ("bool", "bool_"):  # numpy's bool_ too; None: off, as in apex
        return bool(enabled)
    if isinstance(enabled, str) and enabled in ("True", "False"):
        return enabled == "True"
    if isinstance(enabled, int) and enabled in (0, 1):
        return bool(enabled)
    raise AmpConfigError(f"enabled must be True or False; got {enabled!r}.")


def check_initial_scale(properties: Properties, min_loss_scale: Optional[float], max_loss_scale: float) -> None:
    """A dynamic scale must start at or above its floor, or the first overflow would raise it."""
    if properties.loss_scale != "dynamic" or not min_loss_scale:
        return
    initial = min(2.0 ** 16, max_loss_scale)
    if min_loss_scale > initial:
        raise AmpConfigError(
            f"min_loss_scale ({min_loss_scale:g}) is above the initial dynamic loss scale ({initial:g} = "
            "min(2**16, max_loss_scale)), so the first overflow would raise the scale instead of lowering "
            "it. Lower min_loss_scale, or use a static loss_scale."
        )


def check_max_nonfinite_losses(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AmpConfigError(
            f"max_nonfinite_losses must be an int >= 0 (0 turns the check off); got {value!r}."
        )


def check_models(models: List[Any]) -> None:
    """Models must be plain (unwrapped) modules, each passed once."""
    for model in models:
        if isinstance(model, _PARALLEL_WRAPPERS):
            raise AmpUsageError(
                f"Incoming model is an instance of {type(model).__module__}.{type(model).__name__}. "
                "Parallel wrappers should only be applied to the model(s) AFTER \n"
                "the model(s) have been returned from amp.initialize."
            )
        if not isinstance(model, torch.nn.Module):
            raise AmpUsageError(
                "models must be either a single model or a list of models (torch.nn.Module); "
                f"got {type(model).__name__}."
            )
        if isinstance(model, torch.jit.ScriptModule):
            raise AmpUsageError(
                f"the model is a TorchScript module ({type(model).__name__}): amp.initialize hooks a model's "
                "forward, which TorchScript modules refuse. Pass the eager model to amp.initialize, and script or "
                "trace it afterwards if needed (MIGRATION.md, TorchScript)."
            )
    seen = set()
    for model in models:
        if id(model) in seen:
            raise AmpUsageError(f"the same {type(model).__name__} appears twice in the models passed to "
                                "amp.initialize; pass each model once.")
        seen.add(id(model))
        meta = next((name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
                     if tensor.is_meta), None)
        if meta is not None:
            raise AmpUsageError(f"{type(model).__name__}'s {meta} is on the meta device (shapes without values): "
                                "amp.initialize would build casts and fp32 masters from no weights. Materialise the "
                                "model first (model.to_empty(device=...) and load or initialise its weights), then "
                                "call amp.initialize.")


def check_models_not_recast(models: List[torch.nn.Module], registered: List[torch.nn.Module],
                            properties: Properties) -> None:
    """Casting a model a second time would stack its forward casts and O2 masters."""
    if not properties.cast_model_type:
        return
    known = {id(model) for model in registered}
    for model in models:
        if id(model) in known:
            cast = any(param.dtype in (torch.float16, torch.bfloat16) for param in model.parameters())
            way_out = (
                "To train it with a new optimizer, pass the optimizer alone: `_, optimizer = amp.initialize([], "
                f"optimizer, opt_level={properties.opt_level!r}, dtype={properties.cast_model_type})` (the model's "
                "dtype, which a call without dtype= would change for the session; its masters start from its current "
                "weights). amp.deinitialize() would not help: it leaves a cast model in its cast dtype."
                if cast else "Or call amp.deinitialize() first (the model is still fp32).")
            raise AmpUsageError(
                f"this {type(model).__name__} was already passed to an earlier amp.initialize in this process, "
                f"and opt_level {properties.opt_level} would cast it again. Initialize a fresh copy of the "
                f"model (e.g. copy.deepcopy before the first initialize). {way_out}"
            )


def _fsdp_kind(model: torch.nn.Module) -> Optional[str]:
    """"FSDP1" or "FSDP2" when the model (or a submodule) is sharded by torch's FSDP, else None."""
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        FullyShardedDataParallel = ()  # noqa: N806  (older torch builds without FSDP1)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        FSDPModule = ()  # noqa: N806  (torch < 2.6 keeps FSDP2 private)
    for module in model.modules():
        if FullyShardedDataParallel and isinstance(module, FullyShardedDataParallel):
            return "FSDP1"
        if FSDPModule and isinstance(module, FSDPModule):
            return "FSDP2"
    return None


def check_sharded_models(models: List[torch.nn.Module], opt_level: str, properties: Properties) -> None:
    """Refuse FSDP1 wrappers, and O2/O3-style model casts of an FSDP2 model (silently wrong)."""
    for model in models:
        kind = _fsdp_kind(model)
        if kind == "FSDP1":
            raise AmpUsageError(
                "the model contains a FullyShardedDataParallel (FSDP1) wrapper: apexlite does not support "
                "FSDP1's flat shards. Shard with torch.distributed.fsdp.fully_shard (FSDP2) and call "
                "apexlite.parallel.initialize_fsdp(model, optimizer, opt_level='O0' or 'O1')."
            )
        if kind == "FSDP2" and (properties.cast_model_type or properties.master_weights):
            raise AmpConfigError(
                f"opt_level={opt_level!r} casts an FSDP2-sharded model (cast_model_type="
                f"{properties.cast_model_type}, master_weights={properties.master_weights}): the shards would "
                "lose their fp32 values or be duplicated by unsharded fp32 masters. Use "
                "apexlite.parallel.initialize_fsdp(model, optimizer, opt_level='O0') with FSDP's "
                "MixedPrecisionPolicy(param_dtype=torch.float16) doing the casting, or opt_level='O1'."
            )


def check_sharded_optimizers(optimizers: List[Any], opt_level: str, properties: Properties) -> None:
    """Refuse fp32 masters for torch's ZeroRedundancyOptimizer: each rank steps the shard of the params it was
    built with, and masters put in their place are in no shard, so nothing would train (silently)."""
    if not properties.master_weights or not torch.distributed.is_available():
        return
    try:
        from torch.distributed.optim import ZeroRedundancyOptimizer
    except ImportError:
        return
    for optimizer in optimizers:
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            raise AmpConfigError(
                f"opt_level={opt_level!r} keeps fp32 master weights in the optimizer's param groups, but a "
                "ZeroRedundancyOptimizer steps only the shard of the params it was built with: the masters "
                "would be in no shard and the model would not train. Use opt_level='O1' with it (fp32 weights, "
                "O1 casts), or a plain optimizer at O2."
            )


def check_optimizers(optimizers: List[Any]) -> None:
    for optimizer in optimizers:
        name = type(optimizer).__name__
        if name == "FP16_Optimizer":
            raise AmpUsageError(
                f"An incoming optimizer is an instance of {type(optimizer).__module__}.{name}. The "
                "optimizer(s) passed to amp.initialize() must be bare instances of either ordinary "
                "Pytorch optimizers, or Apex fused optimizers.\n"
            )
        if not (hasattr(optimizer, "param_groups") and callable(getattr(optimizer, "step", None))):
            raise AmpUsageError(
                "optimizers must be either a single optimizer or a list of optimizers "
                f"(torch.optim.Optimizer or an optimizer wrapper such as LARC); got {name}."
            )
        if _needs_closure(optimizer):
            raise AmpUsageError(
                f"{name} steps only as optimizer.step(closure), re-running the forward and backward inside the "
                "step, where amp.scale_loss cannot scale them (apex refused closures at the step too). Train it "
                "without amp, or use an optimizer that steps without a closure.")
    seen = set()
    for optimizer in optimizers:
        if hasattr(optimizer, "_amp_stash") or id(optimizer) in seen:
            raise AmpUsageError("A given optimizer should only be passed through amp.initialize once.")
        seen.add(id(optimizer))


def _needs_closure(optimizer: Any) -> bool:
    """Whether the optimizer's step requires a closure argument (torch.optim.LBFGS)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin or wrapped step without a signature
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def check_unique_params(optimizers: List[Any]) -> None:
    """With master weights a param in two groups (or two optimizers) would get two diverging masters."""
    owners: dict = {}
    for index, optimizer in enumerate(optimizers):
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in owners:
                    raise AmpUsageError(
                        f"a parameter of shape {tuple(param.shape)} appears in more than one parameter group "
                        f"(optimizer {owners[id(param)]} and optimizer {index}); with master weights each "
                        "copy would be trained separately. Put each parameter in exactly one group."
                    )
                owners[id(param)] = index


def _floating_tensors(model: torch.nn.Module):
    for name, param in model.named_parameters():
        yield "param", name, param
    for name, buffer in model.named_buffers():
        yield "buffer", name, buffer


def check_no_float64(models: List[torch.nn.Module], properties: Properties) -> None:
    """O2/O3 would silently cast float64 weights to fp16/bf16; O1 leaves them alone instead."""
    if properties.cast_model_type not in (torch.float16, torch.bfloat16):
        return
    for model in models:
        for kind, name, tensor in _floating_tensors(model):
            if tensor.dtype is torch.float64:
                raise AmpConfigError(
                    f"{kind} {name} is float64: opt_level {properties.opt_level} would cast it to "
                    f"{properties.cast_model_type}, losing far more precision than the model asked for. "
                    "Call model.float() before amp.initialize, or use opt_level='O1' (which leaves float64 "
                    "tensors alone)."
                )


def check_params_fp32(models: List[torch.nn.Module], properties: Properties) -> None:
    """Models must arrive in fp32: amp does the casting (O2/O3) or leaves weights fp32 (O0/O1)."""
    for model in models:
        for kind, name, tensor in _floating_tensors(model):
            if tensor.dtype in (torch.float16, torch.bfloat16):
                raise AmpUsageError(
                    f"Found {kind} {name} with dtype {tensor.dtype}; amp.initialize expects an fp32 model.\n"
                    "When using amp.initialize, you do not need to call .half() on your model\n"
                    f"before passing it, no matter what optimization level you choose "
                    f"(opt_level {properties.opt_level} casts for you)."
                )


def check_optimizer_params_in_models(optimizers: List[Any], models: List[torch.nn.Module]) -> None:
    """Under a model cast, an optimizer none of whose params belongs to a model passed to initialize was built
    for another model (a copy, an earlier instance): refused. Params outside the models beside model params
    (a learned loss weight) must be fp32; they stay so and are stepped directly, as apex did (logged)."""
    owned = {id(p) for model in models for p in model.parameters()}
    for optimizer in optimizers:
        params = [param for group in optimizer.param_groups for param in group["params"]]
        outside = [param for param in params if id(param) not in owned]
        if not outside:
            continue
        name = type(optimizer).__name__
        if len(outside) == len(params):
            raise AmpUsageError(
                f"none of the {len(params)} parameters {name} holds belongs to a model passed to amp.initialize, "
                "so the model cast would not reach them and training would not change the model. Build the "
                "optimizer from model.parameters() and pass that model (or all models, as a list) to "
                "amp.initialize.")
        low = [tuple(param.shape) for param in outside if param.dtype is not torch.float32]
        if low:
            raise AmpUsageError(
                f"{name} holds parameters that belong to no model passed to amp.initialize and are not float32 "
                f"(shapes {low}); keep such parameters in float32 (they are stepped as they are), or pass their "
                "module to amp.initialize with the model.")
        log.info("%s: %d parameter(s) outside the models (shapes %s) stay float32 and are stepped directly, as "
                 "apex did", name, len(outside), [tuple(param.shape) for param in outside][:5])


def sparse_grad_error() -> AmpUsageError:
    return AmpUsageError(
        "O2 master weights do not support sparse gradients (e.g. nn.Embedding(sparse=True)); use "
        "opt_level='O1', or sparse=False."
    )
