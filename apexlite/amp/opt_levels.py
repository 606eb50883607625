"""The O0-O3 optimisation levels as data, and the validated resolution of user overrides."""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpConfigError

log = get_logger("amp")

LossScale = Union[float, str]


@dataclass(frozen=True)
class OptLevel:
    """One optimisation level's defaults (the property table users know from apex)."""

    name: str
    brief: str
    cast_model_type: Optional[torch.dtype]
    patch_torch_functions: bool
    keep_batchnorm_fp32: Optional[bool]
    master_weights: Optional[bool]
    loss_scale: LossScale


OPT_LEVELS: Dict[str, OptLevel] = {
    level.name: level
    for level in (
        OptLevel("O0", "O0:  Pure FP32 training.\n", torch.float32, False, None, False, 1.0),
        OptLevel(
            "O1",
            "O1:  Insert automatic casts around Pytorch functions and Tensor methods.\n",
            None, True, None, None, "dynamic",
        ),
        OptLevel(
            "O2",
            "O2:  FP16 training with FP32 batchnorm and FP32 master weights.\n",
            torch.float16, False, True, True, "dynamic",
        ),
        OptLevel("O3", "O3:  Pure FP16 training.", torch.float16, False, False, False, 1.0),
    )
}

# The order apex printed and applied options in; the banner and the overrides follow it.
OPTION_ORDER = (
    "enabled", "opt_level", "cast_model_type", "patch_torch_functions",
    "keep_batchnorm_fp32", "master_weights", "loss_scale",
)

LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class Properties:
    """The resolved options of one `initialize` call (what `_amp_state.opt_properties` held in apex)."""

    enabled: bool = False
    opt_level: Optional[str] = None
    cast_model_type: Optional[Any] = None
    patch_torch_functions: bool = False
    keep_batchnorm_fp32: Optional[bool] = None
    master_weights: Optional[bool] = None
    loss_scale: LossScale = 1.0

    def items(self):
        """(name, value) pairs in apex's option order."""
        return [(name, getattr(self, name)) for name in OPTION_ORDER]

    @property
    def options(self) -> Mapping[str, Any]:
        """apex's `properties.options` dict, read-only (code reads `options["cast_model_type"]`); the options
        are set through amp.initialize's arguments, so a write raises instead of being ignored."""
        return types.MappingProxyType(dict(self.items()))


def unknown_opt_level_message(opt_level: Any) -> str:
    """The message apex users grep for when they type 01 instead of O1."""
    return (
        f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', 'O3'.  "
        "Note that in `O0`, `O1`, etc., the prefix O is the letter O, not the number zero."
    )


def defaults_for(opt_level: str, dtype: torch.dtype) -> Properties:
    """The level's default properties, with the low-precision dtype substituted for fp16."""
    if opt_level not in OPT_LEVELS:
        raise AmpConfigError(unknown_opt_level_message(opt_level))
    level = OPT_LEVELS[opt_level]
    cast_type = level.cast_model_type
    if cast_type is torch.float16:
        cast_type = dtype
    loss_scale = level.loss_scale
    if dtype is torch.bfloat16 and loss_scale == "dynamic":
        # bf16 has fp32's exponent range: gradients do not underflow, so no scaling is needed.
        loss_scale = 1.0
    return Properties(
        enabled=True, opt_level=level.name, cast_model_type=cast_type,
        patch_torch_functions=level.patch_torch_functions,
        keep_batchnorm_fp32=level.keep_batchnorm_fp32,
        master_weights=level.master_weights, loss_scale=loss_scale,
    )


def _parse_bool_option(name: str, value: Any) -> Optional[bool]:
    if value in (True, False, None):
        return value
    if value in ("True", "False"):
        return value == "True"
    raise AmpConfigError(
        f"{name} must be True, False, None or the strings 'True'/'False'; got {name}={value!r}."
    )


def _parse_loss_scale(value: Any) -> LossScale:
    if value == "dynamic":
        return "dynamic"
    try:
        if isinstance(value, bool):  # loss_scale=True read as 1.0 (no scaling) is never what was meant
            raise TypeError
        scale = float(value)
    except (TypeError, ValueError):
        raise AmpConfigError(
            f"loss_scale must be a positive number, a numeric string such as '128.0', or 'dynamic'; "
            f"got loss_scale={value!r}."
        ) from None
    if not scale > 0 or scale == float("inf"):
        raise AmpConfigError(f"loss_scale must be a finite number > 0; got loss_scale={value!r}.")
    return scale


def _check_cast_model_type(props: Properties, value: Any, waived: str = "") -> Any:
    if value is False or value is None:
        return value
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise AmpConfigError(
            f"cast_model_type must be a floating torch.dtype, None or False; got {value!r}."
        )
    if not applies_at("cast_model_type", value, props.opt_level):
        raise AmpConfigError(
            "cast_model_type must stay None with opt_level='O1': O1 casts around torch functions and "
            "keeps the model weights in fp32. To cast the model itself, use opt_level='O2' or 'O3'. "
            f"cast_model_type was {value}" + waived
        )
    return value


def applies_at(name: str, value: Any, opt_level: str) -> bool:
    """Whether `initialize` takes option `name` set to `value` at `opt_level` (O1 keeps an fp32 model: no
    model cast, batchnorm or master options; only O1 patches torch functions). The value's own form is
    checked in resolve_properties."""
    if value is None:
        return True
    if name in ("keep_batchnorm_fp32", "master_weights"):
        return opt_level != "O1"
    if name == "cast_model_type":
        return opt_level != "O1" or value is False or value is torch.float32
    if name == "patch_torch_functions":
        return opt_level == "O1" or not value
    return True


def resolve_properties(opt_level: str, dtype: torch.dtype, overrides: Dict[str, Any],
                       hard_override: bool = False) -> Properties:
    """Apply the non-None `overrides` to the level's defaults, validating each one by name.

    Raises AmpConfigError (a RuntimeError and a ValueError) naming the option, the bad value and the fix.
    With `hard_override` (apex's `amp._amp_state.hard_override`), keep_batchnorm_fp32 or master_weights set
    at O1 is only warned about, as apex did, and left out: O1 keeps an fp32 model, where neither changes
    anything. A model cast or patched functions at a level apex refused them stay refused (apexlite does
    not run those mixtures).
    """
    props = defaults_for(opt_level, dtype)
    for name in OPTION_ORDER[2:]:
        value = overrides.get(name)
        if value is None:
            continue
        waived = " (amp._amp_state.hard_override does not waive this: apexlite does not run that mixture)" \
            if hard_override else ""
        if name == "cast_model_type":
            value = _check_cast_model_type(props, value, waived)
        elif name == "patch_torch_functions":
            if not applies_at(name, value, props.opt_level):
                raise AmpConfigError(
                    "patch_torch_functions=True is only valid with opt_level='O1' "
                    f"(opt_level is {props.opt_level}); select O1 instead of overriding it." + waived
                )
            value = bool(value)
        elif name == "keep_batchnorm_fp32":
            value = _parse_bool_option(name, value)
            if not applies_at(name, value, props.opt_level):
                _refuse_unless_overridden(
                    "keep_batchnorm_fp32 must stay None with opt_level='O1': O1 already runs batchnorm "
                    f"in fp32. keep_batchnorm_fp32 was {value}", hard_override)
                continue
        elif name == "master_weights":
            value = _parse_bool_option(name, value)
            if not applies_at(name, value, props.opt_level):
                _refuse_unless_overridden(
                    "master_weights must stay None with opt_level='O1': O1 keeps the model weights in "
                    "fp32, so they are already the master weights.", hard_override)
                continue
        elif name == "loss_scale":
            value = _parse_loss_scale(value)
        props = dataclasses.replace(props, **{name: value})
    return props


def _refuse_unless_overridden(message: str, hard_override: bool) -> None:
    if not hard_override:
        raise AmpConfigError(message)
    log.warning("Warning:  %s (amp._amp_state.hard_override: left out)", message)


def option_lines(props: Properties) -> list:
    """The option table in apex's exact layout (log parsers depend on it)."""
    return ["{:22} : {}".format(name, value) for name, value in props.items()]


def banner(opt_level: str, defaults: Properties, resolved: Properties) -> str:
    """The verbosity-1 text `initialize` logs: the level, its defaults, then the resolved options."""
    return "\n".join(
        ["Selected optimization level " + OPT_LEVELS[opt_level].brief, "Defaults for this optimization level are:"]
        + option_lines(defaults)
        + ["Processing user overrides (additional kwargs that are not None)...",
           "After processing overrides, optimization options are:"]
        + option_lines(resolved)
    )
