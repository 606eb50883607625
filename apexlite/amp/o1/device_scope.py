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
import threading
from typing import Any, Callable, FrozenSet, Iterable, Optional, Set

import torch

from apexlite.amp.o1.cache import compile_flag


def device_types_of(models: Iterable[torch.nn.Module], modules: Optional[Set[int]] = None) -> FrozenSet[str]:
    """The device types of every param and buffer of `models`, in one walk over their modules (whose ids are
    added to `modules` when given)."""
    found = set()
    for model in models:
        for module in model.modules():
            if modules is not None:
                modules.add(id(module))
            for tensors in (module._parameters, module._buffers):
                for tensor in tensors.values():
                    if tensor is not None:
                        found.add(tensor.device.type)
    return frozenset(found)


def scope_of(models: Iterable[torch.nn.Module], modules: Optional[Set[int]] = None) -> Optional[FrozenSet[str]]:
    """The device types O1 casts on for a session with these models (None: every device)."""
    found = device_types_of(models, modules)
    if found:
        return found
    return frozenset({"cuda"}) if torch.cuda.is_available() else None


def rescope(session: Any) -> None:
    """Re-read the scope from the session's models (and which modules are theirs, whose moves re-read it);
    compiled graphs traced under the old scope are dropped (they hold O1's casts as they were when traced, and
    guard nothing of them)."""
    from apexlite.amp.o1.compiled_graphs import forget_compiled_graphs

    modules: Set[int] = set()
    scope = scope_of(session.models, modules)
    if session.model_moves is not None:
        session.model_moves.watched = modules
    if scope != session.cast_state.device_types:
        session.cast_state.device_types = scope
        forget_compiled_graphs()


class ModelMoves:
    """What the patched `Module._apply` keeps per session: torch's own `_apply`, and each thread's nesting depth
    (a move recurses through every submodule; the scope is re-read once, when the outermost call returns)."""

    def __init__(self, original: Callable) -> None:
        self.original = original
        self.local = threading.local()
        self.watched: Set[int] = set()  # ids of the registered models' modules (as of the last re-read)


def apply_then_rescope(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """`torch.nn.Module._apply` while O1 is installed: a move of a registered model or of a module of one (`to`,
    `cuda`, `cpu`, `to_empty`, a layer moved alone) re-reads the scope when it returns; other modules move as
    in torch. A plain function (torch.compile guards
    class attributes that are functions) that pickles by name."""
    if _compiling():  # a move inside compiled code runs eagerly (it changes the session, not the graph)
        return _apply_eagerly(module, *args, **kwargs)
    return _apply_and_rescope(module, *args, **kwargs)


def _apply_and_rescope(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    from apexlite.amp.session import current_session

    session = current_session(required=False)
    moves = getattr(session, "model_moves", None)
    if moves is None:  # the session ended while this call looked it up: torch's own, as restored
        return _TORCH_APPLY(module, *args, **kwargs)
    depth = getattr(moves.local, "depth", 0)
    moves.local.depth = depth + 1
    try:
        return moves.original(module, *args, **kwargs)
    finally:
        moves.local.depth = depth
        if depth == 0 and id(module) in moves.watched and not session.closed:
            rescope(session)


_apply_eagerly = torch._disable_dynamo(_apply_and_rescope)
_compiling = compile_flag()

# named where it is installed, as O1's other patches are: a pickle of it names torch alone (function_wrappers.py)
apply_then_rescope.__module__ = torch.nn.Module.__module__
apply_then_rescope.__qualname__ = "Module._apply"


def follow_model_moves(patcher: Any, session: Any) -> None:
    """While O1 is installed, moving a module re-reads the scope, so casts follow the models to their devices from
    the next op on, compiled or not; moves run eagerly, never inside a compiled forward."""
    from apexlite.amp.o1.patcher import raw_attribute

    session.model_moves = ModelMoves(raw_attribute(torch.nn.Module, "_apply"))
    patcher.set_attribute(torch.nn.Module, "_apply", apply_then_rescope)
    patcher.add_undo(lambda: setattr(session, "model_moves", None), "the session's record of model moves")


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


_TORCH_APPLY = torch.nn.Module._apply  # torch's, as imported: for a call racing the end of its session
