"""Which devices O1 casts on: those its models live on.

NOTE [device scope]
torch.autocast casts on the one device type it is entered for, and apex cast CUDA tensors only. O1 casts
the floating tensors on the device types the session's models hold params or buffers on (CUDA for a model
on a GPU, CPU for a model trained on the CPU), so CPU work beside a GPU model (a data pipeline in the main
process, metrics, audio features or augmentations computed on the CPU) runs as written, in fp32. A PROMOTE
op looks only at the tensors in scope. Moving a registered model after `initialize` re-reads the scope
(`follow_model_moves`), and compiled graphs traced under the old scope are dropped. Without a model to
read (apex's `amp.init`, models without params or buffers), the scope is CUDA where CUDA is available, as
in apex, else every device. Both cast paths read
`CastState.device_types` (None: every device); the Python path tests a tensor with `scope_check`.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, FrozenSet, Iterable, Optional

import torch


def device_types_of(models: Iterable[torch.nn.Module]) -> FrozenSet[str]:
    """The device types of every param and buffer of `models`."""
    return frozenset(tensor.device.type for model in models
                     for tensors in (model.parameters(), model.buffers()) for tensor in tensors)


def scope_of(models: Iterable[torch.nn.Module]) -> Optional[FrozenSet[str]]:
    """The device types O1 casts on for a session with these models (None: every device)."""
    found = device_types_of(models)
    if found:
        return found
    return frozenset({"cuda"}) if torch.cuda.is_available() else None


def rescope(session: Any) -> None:
    """Re-read the scope from the session's models; compiled graphs traced under the old one are dropped (they
    hold O1's casts as they were when traced, and guard nothing of them)."""
    from apexlite.amp.o1.compiled_graphs import forget_compiled_graphs

    scope = scope_of(session.models)
    if scope != session.cast_state.device_types:
        session.cast_state.device_types = scope
        forget_compiled_graphs()


def follow_model_moves(patcher: Any, session: Any) -> None:
    """While O1 is installed, moving a registered model (`to`, `cuda`, `cpu`, `to_empty`: all go through
    `Module._apply`) re-reads the scope, so casts follow the model to its new device from the next op on,
    compiled or not; moves run eagerly, never inside a compiled forward."""
    from apexlite.amp.o1.function_wrappers import make_function_wrapper
    from apexlite.amp.o1.patcher import raw_attribute

    def apply_then_rescope(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        result = wrapped(*args, **kwargs)
        if instance in session.models:
            rescope(session)
        return result

    original = raw_attribute(torch.nn.Module, "_apply")
    patched = make_function_wrapper(original, apply_then_rescope, (torch.nn.Module, "_apply"))
    patcher.set_attribute(torch.nn.Module, "_apply", patched)


def normalized(device_types: Iterable[str]) -> FrozenSet[str]:
    """Device type names as torch names them ("cuda:0" -> "cuda"); ValueError for a name torch does not know."""
    names = set()
    for name in device_types:
        try:
            names.add(torch.device(name).type)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"unknown device type {name!r} in device_types: {error}") from None
    return frozenset(names)


def scope_check(device_types: Optional[FrozenSet[str]]) -> Optional[Callable[[torch.Tensor], bool]]:
    """Whether a tensor is on `device_types`, as the Python cast path asks it per tensor (None: every device is).
    `tensor.device` builds a device object (about 0.3 µs); the one-device scopes read a flag instead."""
    if device_types is None:
        return None
    if device_types == {"cpu"}:
        return operator.attrgetter("is_cpu")
    if device_types == {"cuda"}:
        return operator.attrgetter("is_cuda")
    return lambda tensor: tensor.device.type in device_types
