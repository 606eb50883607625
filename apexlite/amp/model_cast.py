"""O2/O3 model conversion and the input/output casts around `forward`.

Casts are forward hooks (a pre-hook for inputs, a hook for outputs), not a replaced `forward`
closing over a bound method, so DataParallel replicas, `copy.deepcopy` and pickling behave. Every
hook handle goes through the session's Patcher. A state-dict hook makes `model.state_dict()` fp32,
as apex did, so checkpoints are dtype-independent; loading one into the cast model casts back.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.o1.policies import map_tensors


def _cast_floating(dtype: torch.dtype):
    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype is not dtype else tensor

    return cast


def _cast_object(dtype: torch.dtype):
    """apex's rule for other values with a `.to` method (a batch class): `value.to(dtype)`. A module passed
    to a forward is left alone (`.to` would cast it in place)."""
    def cast(value: Any) -> Any:
        to = getattr(value, "to", None)
        return to(dtype) if callable(to) and not isinstance(value, torch.nn.Module) else value

    return cast


class CastInputs:
    """Forward pre-hook: floating tensor inputs (args and kwargs, nested) to the model's dtype, and other
    inputs with a `.to` method through it, as apex's O2/O3 did."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module, args, kwargs):
        cast, cast_object = _cast_floating(self.dtype), _cast_object(self.dtype)
        return map_tensors(tuple(args), cast, cast_object), map_tensors(dict(kwargs), cast, cast_object)


class CastOutputs:
    """Forward hook: floating tensor outputs (nested) to `dtype` (fp32 unless cast_model_outputs), and other
    outputs with a `.to` method through it."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module, args, output):
        return map_tensors(output, _cast_floating(self.dtype), _cast_object(self.dtype))


class Fp32StateDict:
    """State-dict hook: the module's own low-precision params and buffers are saved as fp32."""

    def __call__(self, module, state_dict, prefix, local_metadata):
        for name in list(module._parameters) + list(module._buffers):
            key = prefix + name
            value = state_dict.get(key)
            if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
                state_dict[key] = value.float()
        return state_dict


def keeps_fp32(module: torch.nn.Module, keep_batchnorm_fp32: Optional[bool]) -> bool:
    """Affine batchnorm layers stay fp32 when keep_batchnorm_fp32 (their stats need the range)."""
    return bool(keep_batchnorm_fp32) and isinstance(module, _BatchNorm) and module.affine


UndoLog = List[Callable[[], None]]


def _restore_param(param: torch.nn.Parameter, data: torch.Tensor, grad: Optional[torch.Tensor]) -> Callable[[], None]:
    def undo() -> None:
        param.data = data
        param.grad = grad

    return undo


def _restore_buffer(module: torch.nn.Module, name: str, buffer: torch.Tensor) -> Callable[[], None]:
    def undo() -> None:
        module._buffers[name] = buffer

    return undo


def convert_network(model: torch.nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: Optional[bool],
                    undo: Optional[UndoLog] = None) -> Dict[torch.nn.Parameter, torch.Tensor]:
    """Cast floating params (in place: Parameter objects keep their identity), grads and buffers.

    Returns {param: its fp32 data before the cast} for every converted param, so O2 master weights
    start from the exact fp32 values instead of a round trip through the low-precision dtype.
    When `undo` is given, a step restoring each change is appended to it (a failed initialize).
    """
    fp32_sources: Dict[torch.nn.Parameter, torch.Tensor] = {}
    undo = [] if undo is None else undo
    for module in model.modules():
        if keeps_fp32(module, keep_batchnorm_fp32):
            continue
        for param in module._parameters.values():
            if param is None or not param.is_floating_point() or param.dtype is dtype:
                continue
            undo.append(_restore_param(param, param.data, param.grad))
            if param.dtype is torch.float32:
                fp32_sources[param] = param.data
            param.data = param.data.to(dtype)
            if param.grad is not None:
                param.grad = param.grad.to(dtype)
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and buffer.dtype is not dtype:
                undo.append(_restore_buffer(module, name, buffer))
                module._buffers[name] = buffer.to(dtype)
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    return fp32_sources


def restore_networks(undo: UndoLog, models: List[torch.nn.Module]) -> None:
    """Undo `convert_network` (newest change first), then re-flatten RNN weights in their old dtype."""
    for step in reversed(undo):
        step()
    undo.clear()
    for model in models:
        for module in model.modules():
            if isinstance(module, torch.nn.RNNBase):
                module.flatten_parameters()


def install_io_casts(model: torch.nn.Module, patcher: Patcher, input_dtype: Optional[torch.dtype],
                     output_dtype: torch.dtype) -> None:
    """Register the input/output cast hooks on the model (inputs only when `input_dtype` is given). The output
    cast runs before the user's forward hooks, so they see the cast output whenever they were registered, as
    with apex's replaced forward; the input cast runs after the pre-hooks registered before it."""
    if input_dtype is not None:
        handle = model.register_forward_pre_hook(CastInputs(input_dtype), with_kwargs=True)
        patcher.add_handle(handle, f"{type(model).__name__} input cast hook", owner=model)
    handle = model.register_forward_hook(CastOutputs(output_dtype), prepend=True)
    patcher.add_handle(handle, f"{type(model).__name__} output cast hook", owner=model)


def install_fp32_state_dict(model: torch.nn.Module, patcher: Patcher) -> None:
    """Make `state_dict()` of the model (and of every submodule) return fp32 tensors."""
    hook = Fp32StateDict()
    for module in model.modules():
        patcher.add_handle(module._register_state_dict_hook(hook), "fp32 state_dict hook", owner=module)


def cast_model(model: torch.nn.Module, patcher: Patcher, dtype: Any, keep_batchnorm_fp32: Optional[bool],
               cast_model_outputs: Optional[torch.dtype],
               undo: Optional[UndoLog] = None) -> Dict[torch.nn.Parameter, torch.Tensor]:
    """The whole O0/O2/O3 model treatment; returns the fp32 sources of converted params."""
    fp32_sources = convert_network(model, dtype, keep_batchnorm_fp32, undo)
    install_io_casts(model, patcher, dtype, cast_model_outputs or torch.float32)
    install_fp32_state_dict(model, patcher)
    return fp32_sources


def install_forward_scope(model: torch.nn.Module, patcher: Patcher, enter: Callable, exit_: Callable) -> None:
    """Hooks that tell the session when this model's forward starts and returns (even by an exception)."""
    patcher.add_handle(model.register_forward_pre_hook(enter), f"{type(model).__name__} forward scope start",
                       owner=model)
    try:
        handle = model.register_forward_hook(exit_, always_call=True)
    except TypeError:  # torch < 2.0 has no always_call: an exception leaves the scope open until scale_loss
        handle = model.register_forward_hook(exit_)
    patcher.add_handle(handle, f"{type(model).__name__} forward scope end", owner=model)
