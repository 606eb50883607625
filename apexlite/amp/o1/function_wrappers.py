"""wrapt's function wrappers for O1 patches, plus what any plain function supports besides a call.

wrapt's proxies refuse pickling and copying ("object proxy must define __reduce__()"), which breaks a
spawn DataLoader given `collate_fn=torch.stack`, or nn.TransformerEncoder deep-copying a layer that
holds F.gelu. An O1 wrapper pickles by reference as the torch function it stands for, and copy.copy /
copy.deepcopy return it unchanged, as they return a function. wrapt still holds every patch.
"""
from __future__ import annotations

import importlib
import pickle
import types
from typing import Any, Optional, Tuple

import wrapt

from apexlite.amp.o1.patcher import resolve


class _ModuleReference:
    """Unpickles as `importlib.import_module(name)`, so a reference can name a module's attribute."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple:
        return importlib.import_module, (self.name,)


def reference(function: Any, location: Optional[Tuple[Any, str]], protocol: int) -> tuple:
    """The reduce value of a by-reference pickle of `function` (naming only torch and the standard library).

    Torch's builtins and method descriptors reduce to getattr(their defining class, name): that value is
    used as it is, so they unpickle as the original even where torch is patched. Python-level functions
    (and builtins of modules) are named by where the patch sits, `location` (owner, name), else by their
    module and qualified name: they unpickle as whatever that name holds where they are loaded (the
    original in a spawn worker).
    """
    if not isinstance(function, types.FunctionType):
        reduced = function.__reduce_ex__(protocol)
        if isinstance(reduced, tuple):
            return reduced
    owner, name = location or _defining_location(function)
    return getattr, (owner if isinstance(owner, type) else _ModuleReference(owner.__name__), name)


def _defining_location(function: Any) -> Tuple[Any, str]:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    try:
        owner_path, _, name = qualname.rpartition(".")
        owner = resolve(f"{module}.{owner_path}") if owner_path else importlib.import_module(module)
        if getattr(owner, name) is not function:
            raise AttributeError(name)
    except (AttributeError, ImportError, TypeError) as exc:
        raise pickle.PicklingError(f"cannot pickle {function!r} by reference: {module}.{qualname} does not "
                                   f"name it") from exc
    return owner, name


class _LikeAFunction:
    """Pickling and copying of an O1 wrapper (mixed into wrapt's wrapper types)."""

    __slots__ = ()

    def _location(self) -> Optional[Tuple[Any, str]]:
        holder = getattr(self, "_self_parent", None) or self
        return getattr(holder, "_self_location", None)

    def __reduce_ex__(self, protocol: int) -> tuple:
        return reference(self.__wrapped__, self._location(), protocol)

    def __reduce__(self) -> tuple:
        return self.__reduce_ex__(pickle.DEFAULT_PROTOCOL)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict) -> Any:
        return self


class O1BoundFunctionWrapper(_LikeAFunction, wrapt.BoundFunctionWrapper):
    """A patched Tensor method as read from a tensor or from the class (wrapt binds one per access)."""


class O1FunctionWrapper(_LikeAFunction, wrapt.FunctionWrapper):
    """The object an O1 patch installs: wrapt's FunctionWrapper around the original torch callable,
    which knows where it is installed (`location`: (module or class, attribute name)) to pickle by it."""

    __bound_function_wrapper__ = O1BoundFunctionWrapper

    def __init__(self, wrapped: Any, wrapper: Any, location: Optional[Tuple[Any, str]] = None) -> None:
        super().__init__(wrapped, wrapper)
        self._self_location = location
