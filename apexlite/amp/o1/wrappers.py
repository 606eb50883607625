"""One wrapt wrapper factory per CastPolicy.

A wrapper receives `(wrapped, instance, args, kwargs)` from wrapt. For a Tensor method `instance` is
the tensor and `wrapped` is already bound to it, so wrappers that must cast `self` call the unbound
original recorded at patch time instead: `original(cast(instance), *cast(args))`.

Every wrapper passes a call straight to the unpatched op, as plain torch runs it, when:
- the call is given `out=` (not None): torch.autocast leaves such calls uncast too, and a cast `out`
  would be a temporary the result is lost in;
- torch.jit is tracing: a trace records plain torch's ops (O1's casts, and its cache's copies, have no
  place in a graph that outlives the session; NOTE [TorchScript] in torchscript.py).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Tuple

import torch
import wrapt

from apexlite._logging import get_logger
from apexlite.amp.o1.cast_state import CastState
from apexlite.amp.o1.function_wrappers import make_function_wrapper
from apexlite.amp.o1.lists import BANNED_MESSAGES
from apexlite.amp.o1.native_casts import native_wrapper
from apexlite.amp.o1.policies import (
    CASTABLE_DTYPES, CONVERTERS, CastPolicy, collect_float_dtypes, is_low_precision, map_tensors, widest,
)

log = get_logger("amp.casts")

is_grad_enabled = torch.is_grad_enabled
tracing = getattr(torch._C, "_is_tracing", lambda: False)  # torch.jit.trace in progress on this thread
Tensor = torch.Tensor


def _caster(state: CastState, dtype: torch.dtype, name: str, use_cache: bool) -> Callable:
    """The per-tensor cast of one wrapper (hot path: every patched call runs it per argument)."""
    castable = CASTABLE_DTYPES
    convert = CONVERTERS[dtype]

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        source_dtype = tensor.dtype
        if source_dtype is dtype or source_dtype not in castable:
            return tensor
        in_scope = state.scope_check
        if in_scope is not None and not in_scope(tensor):
            return tensor
        if state.log_casts:
            log.debug("%s->%s (%s)", source_dtype, dtype, name)
        if use_cache and state.use_cache and (is_grad_enabled() or state.thread.in_forward):
            return state.cache.cast(tensor, dtype)  # the cache decides what is a weight
        return convert(tensor)

    return cast


def _cast_call(original, instance, args, kwargs, cast) -> Any:
    """Call `original` with every floating tensor in args, kwargs (and `instance`) passed through `cast`."""
    cast_args = []
    for arg in args:
        if isinstance(arg, Tensor):
            arg = cast(arg)
        elif isinstance(arg, (list, tuple, dict)):
            arg = map_tensors(arg, cast)
        cast_args.append(arg)
    if kwargs:
        kwargs = {key: map_tensors(value, cast) for key, value in kwargs.items()}
    if instance is None:
        return original(*cast_args, **kwargs)
    return original(cast(instance), *cast_args, **kwargs)


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_dynamo_tracing = getattr(torch.compiler, "is_dynamo_compiling", lambda: False)
_TORCH_INTERNALS = ("torch._decomp", "torch._refs", "torch._prims")


def called_by_torch_internals() -> bool:
    """A torch decomposition calling the patched op while a dispatch mode traces (torch.compile's AOT step,
    make_fx): its dtypes are torch's own choice (the CPU attention math upcasts to fp32), so no O1 cast
    applies. Only looked at while a dispatch mode is active, never while dynamo traces user code."""
    if _dynamo_tracing() or not _dispatch_modes():
        return False
    frame = sys._getframe(2)  # wrapper <- wrapt (C: no frame; pure Python: one) <- the caller
    if frame is not None and frame.f_globals.get("__name__", "").startswith("wrapt"):
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith(_TORCH_INTERNALS)


def _fixed_dtype_wrapper(state: CastState, original: Callable, name: str, low: bool) -> Callable:
    """LOW_PRECISION (cached, dtype read per call) or FLOAT (uncached) casts."""
    casters = {}
    fp32_cast = None if low else _caster(state, torch.float32, name, use_cache=False)

    def wrapper(wrapped, instance, args, kwargs):
        if (not state.active or state.thread.disabled_depth or tracing() or (kwargs and kwargs.get("out") is not None)
                or called_by_torch_internals()):
            return wrapped(*args, **kwargs)
        cast = fp32_cast
        if cast is None:
            cast = casters.get(state.low_dtype)
            if cast is None:
                cast = casters[state.low_dtype] = _caster(state, state.low_dtype, name, use_cache=True)
        return _cast_call(original, instance, args, kwargs, cast)

    return wrapper


def _promote_wrapper(state: CastState, original: Callable, name: str, sequence: bool) -> Callable:
    def wrapper(wrapped, instance, args, kwargs):
        if (not state.active or state.thread.disabled_depth or tracing() or (kwargs and kwargs.get("out") is not None)
                or called_by_torch_internals()):
            return wrapped(*args, **kwargs)
        found: set = set()
        scope = state.scope_check
        if instance is not None:
            collect_float_dtypes(instance, found, scope)
        collect_float_dtypes(args[0] if sequence and args else args, found, scope)
        if not sequence:
            collect_float_dtypes(kwargs, found, scope)
        if len(found) <= 1:
            return wrapped(*args, **kwargs)
        cast = _caster(state, widest(found), name, use_cache=False)
        if sequence:
            return original(map_tensors(list(args[0]), cast), *args[1:], **kwargs)
        return _cast_call(original, instance, args, kwargs, cast)

    return wrapper


def _match_self_wrapper(state: CastState, original: Callable, name: str) -> Callable:
    def wrapper(wrapped, instance, args, kwargs):
        if (not state.enabled or instance is None or instance.dtype not in CASTABLE_DTYPES or tracing()
                or (state.scope_check is not None and not state.scope_check(instance))):
            return wrapped(*args, **kwargs)
        cast = _caster(state, instance.dtype, name, use_cache=False)
        args = [map_tensors(arg, cast) for arg in args]
        kwargs = {key: map_tensors(value, cast) for key, value in kwargs.items()}
        return wrapped(*args, **kwargs)

    return wrapper


def _inplace_float_wrapper(state: CastState, original: Callable, name: str) -> Callable:
    def wrapper(wrapped, instance, args, kwargs):
        if tracing():
            return wrapped(*args, **kwargs)
        target = instance if instance is not None else (args[0] if args else None)
        if isinstance(target, torch.Tensor) and is_low_precision(target, state.scope_check):
            raise NotImplementedError(
                f"Cannot call in-place {name} on a {target.dtype} tensor under amp O1: {name} is forced "
                f"to fp32, which an in-place op cannot do. Use the out-of-place form, or call .float() first."
            )
        if not state.enabled:
            return wrapped(*args, **kwargs)
        cast = _caster(state, torch.float32, name, use_cache=False)
        if instance is None:
            return wrapped(args[0], *[map_tensors(arg, cast) for arg in args[1:]],
                           **{key: map_tensors(value, cast) for key, value in kwargs.items()})
        return wrapped(*[map_tensors(arg, cast) for arg in args],
                       **{key: map_tensors(value, cast) for key, value in kwargs.items()})

    return wrapper


def _banned_wrapper(state: CastState, original: Callable, name: str) -> Callable:
    message = BANNED_MESSAGES.get(
        name.rsplit(".", 1)[-1], f"{name} is not supported with low-precision inputs under amp O1."
    )
    float_call = _fixed_dtype_wrapper(state, original, name, low=False)

    def wrapper(wrapped, instance, args, kwargs):
        if tracing():
            return wrapped(*args, **kwargs)
        if state.allow_banned:
            return float_call(wrapped, instance, args, kwargs)
        scope = state.scope_check
        if any(is_low_precision(arg, scope) for arg in args) or any(is_low_precision(v, scope) for v in kwargs.values()):
            raise NotImplementedError(message)
        return wrapped(*args, **kwargs)

    return wrapper


def _python_wrapper(policy: CastPolicy, state: CastState, original: Callable, name: str) -> Callable:
    """The pure-Python wrapper function for `policy` (the reference implementation)."""
    if policy is CastPolicy.LOW_PRECISION:
        return _fixed_dtype_wrapper(state, original, name, low=True)
    if policy is CastPolicy.FLOAT:
        return _fixed_dtype_wrapper(state, original, name, low=False)
    if policy is CastPolicy.PROMOTE:
        return _promote_wrapper(state, original, name, sequence=False)
    if policy is CastPolicy.SEQUENCE_PROMOTE:
        return _promote_wrapper(state, original, name, sequence=True)
    if policy is CastPolicy.MATCH_SELF:
        return _match_self_wrapper(state, original, name)
    if policy is CastPolicy.INPLACE_FLOAT:
        return _inplace_float_wrapper(state, original, name)
    if policy is CastPolicy.BANNED:
        return _banned_wrapper(state, original, name)
    raise ValueError(f"unknown cast policy {policy}")  # pragma: no cover - the enum is closed


def make_wrapper(policy: CastPolicy, state: CastState, original: Callable, name: str,
                 location: Optional[Tuple[Any, str]] = None) -> wrapt.FunctionWrapper:
    """A wrapt FunctionWrapper around `original` (a function, or a raw method descriptor) for `policy`,
    to be installed at `location` ((module or class, attribute name); function_wrappers.py).

    Wrappers that cast `self` call `original(cast(self), ...)` rather than wrapt's bound `wrapped`.
    With a native session state the four casting policies get apexlite._C's wrapper, the rest Python's.
    """
    wrapper = native_wrapper(policy, state, original, name) or _python_wrapper(policy, state, original, name)
    return make_function_wrapper(original, wrapper, location)
