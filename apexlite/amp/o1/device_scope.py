"""Which devices O1 casts on: those its models live on.

NOTE [device scope]
torch.autocast casts on the one device type it is entered for, and apex cast CUDA tensors only. O1 casts
the floating tensors on the device types the session's models hold params or buffers on (CUDA for a model
on a GPU, CPU for a model trained on the CPU), so CPU work beside a GPU model (a data pipeline in the main
process, metrics, audio features or augmentations computed on the CPU) runs as written, in fp32. A PROMOTE
op looks only at the tensors in scope. Each registered model's forward adds the device type it runs on
(a model moved after `initialize`). Without a model to read (apex's `amp.init`, models without params or
buffers), the scope is CUDA where CUDA is available, as in apex, else every device. Both cast paths read
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


def follow_model(state: Any, module: torch.nn.Module) -> None:
    """A registered model's forward starts: its device type joins the scope (a model moved since initialize)."""
    scope = state.device_types
    if scope is None:
        return
    param = next(module.parameters(), None)
    if param is not None and param.device.type not in scope:
        state.device_types = scope | {param.device.type}


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
