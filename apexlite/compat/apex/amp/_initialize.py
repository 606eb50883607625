"""`apex.amp._initialize`: the helpers of apex's initialize that code reaches for.

`applier(value, fn)` and `to_type(dtype, t)` cast batches as apex's O2/O3 forward did; the check_*
functions run apexlite's own checks; `O2StateDictHook` saves low-precision weights as fp32.
apexlite's amp.initialize does the initializing itself, so replacing `applier` or `to_type` here has no
effect on it: that is logged (apexlite casts inputs on every device, so a device-specific applier is
not needed). Re-exported names come from the table (apexlite.compat.generic).
"""
from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any, Callable, List

import torch

from apexlite._logging import get_logger
from apexlite.amp import checks
from apexlite.compat import generic
from apexlite.compat.apex.amp._amp_state import _amp_state

log = get_logger("amp")
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def to_type(dtype: torch.dtype, t: Any) -> Any:
    """A floating tensor cast to `dtype` (other tensors unchanged); any other object's own `.to(dtype)`."""
    if isinstance(t, torch.Tensor):
        return t.to(dtype) if t.is_floating_point() else t
    return t.to(dtype)


def _is_ndarray(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def applier(value: Any, fn: Callable[[Any], Any]) -> Any:
    """`fn` applied to every tensor (and every object with a `.to` method) inside `value`.

    Strings and numpy arrays are returned as they are; mappings become dicts with both keys and values
    walked; other iterables are rebuilt with their own type (namedtuples too, where apex's raised);
    anything else is returned unchanged.
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, str) or _is_ndarray(value):
        return value
    if hasattr(value, "to"):
        return fn(value)
    if isinstance(value, Mapping):
        return {applier(key, fn): applier(item, fn) for key, item in value.items()}
    if isinstance(value, Iterable):
        items = [applier(item, fn) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def check_models(models: List[Any]) -> None:
    """Raise when a model is already wrapped for parallelism (wrap after amp.initialize)."""
    checks.check_models(list(models))


def check_params_fp32(models: List[torch.nn.Module]) -> None:
    """Raise when a model holds fp16/bf16 params or buffers (amp.initialize wants an fp32 model)."""
    checks.check_params_fp32(list(models), _amp_state.opt_properties)


def check_optimizers(optimizers: List[Any]) -> None:
    """Raise for an FP16_Optimizer, a non-optimizer, or an optimizer passed through amp twice."""
    checks.check_optimizers(list(optimizers))


class O2StateDictHook:
    """A state-dict hook that saves the module's fp16/bf16 tensors through `fn` (e.g. to fp32)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn

    def __call__(self, module: torch.nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        for key, value in state_dict.items():
            if "num_batches_tracked" in key or not isinstance(value, torch.Tensor):
                continue
            if value.dtype in _LOW_PRECISION:
                state_dict[key] = self.fn(value)


class _InitializeModule(types.ModuleType):
    """Logs that rebinding `applier` / `to_type` does not change how apexlite's amp.initialize casts."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("applier", "to_type") and name in self.__dict__:
            log.warning("apex.amp._initialize.%s was replaced; apexlite's amp.initialize does not call it (it "
                        "casts model inputs itself, on every device), so the replacement has no effect there.",
                        name)
        super().__setattr__(name, value)


__getattr__ = generic.fallback_getattr(__name__)
sys.modules[__name__].__class__ = _InitializeModule
