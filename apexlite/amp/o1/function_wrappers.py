"""The wrapt wrappers O1 patches install, and what a plain function supports besides a call.

wrapt's proxies refuse pickling and copying ("object proxy must define __reduce__()"), which broke a
spawn DataLoader given `collate_fn=torch.stack`, and nn.TransformerEncoder deep-copying a layer that
holds F.gelu. Each patch records where it is installed (LOCATION) and pickles by reference as the torch
function it stands for (`reference`); wrapt still holds every patch.
- A module's function (torch.stack, F.gelu) gets an O1FunctionWrapper, which also copies as itself
  (copy.copy / copy.deepcopy return it, as they return a function).
- A class's method (torch.Tensor.mm) keeps wrapt's own FunctionWrapper: every read from a tensor binds
  a wrapt BoundFunctionWrapper, and a subclass there would add a lookup and a Python-level instance to
  every Tensor-method call. Its bound wrappers pickle through a copyreg reducer installed with the O1
  layer (`install_method_pickling`); copying one is refused by wrapt, as before.
"""
from __future__ import annotations

import copyreg
import importlib
import pickle
import types
from typing import Any, Callable, Optional, Tuple

import wrapt

from apexlite.amp.o1.patcher import Patcher, resolve

LOCATION = "_self_apexlite_location"  # on a patch: (module or class, attribute name) it is installed at
_MISSING = object()


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
    (and builtins of modules) are named by where the patch sits, `location`, else by their module and
    qualified name: they unpickle as whatever that name holds where they are loaded (the original in a
    spawn worker).
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


class O1FunctionWrapper(wrapt.FunctionWrapper):
    """wrapt's FunctionWrapper for a patched module function: pickles by reference, copies as itself."""

    def __reduce_ex__(self, protocol: int) -> tuple:
        return reference(self.__wrapped__, getattr(self, LOCATION, None), protocol)

    def __reduce__(self) -> tuple:
        return self.__reduce_ex__(pickle.DEFAULT_PROTOCOL)

    def __copy__(self) -> "O1FunctionWrapper":
        return self

    def __deepcopy__(self, memo: dict) -> "O1FunctionWrapper":
        return self


def make_function_wrapper(original: Callable, wrapper: Callable,
                          location: Optional[Tuple[Any, str]]) -> wrapt.FunctionWrapper:
    """The wrapt wrapper of `original` to install at `location` (None: installed nowhere, a decorator's)."""
    on_a_class = location is not None and isinstance(location[0], type)
    patched = wrapt.FunctionWrapper(original, wrapper) if on_a_class else O1FunctionWrapper(original, wrapper)
    setattr(patched, LOCATION, location)
    return patched


def _reduce_bound_wrapper(bound: wrapt.BoundFunctionWrapper) -> Any:
    """copyreg reducer of wrapt's bound wrappers: a patched method by reference; any other bound wrapper
    exactly as wrapt reduces it (which refuses)."""
    location = getattr(getattr(bound, "_self_parent", None), LOCATION, None)
    if location is None:
        return bound.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return reference(bound.__wrapped__, location, pickle.DEFAULT_PROTOCOL)


def install_method_pickling(patcher: Patcher) -> None:
    """Register `_reduce_bound_wrapper` with copyreg while the O1 layer is installed (undone by `patcher`)."""
    table = copyreg.dispatch_table
    kind = wrapt.BoundFunctionWrapper
    previous = table.get(kind, _MISSING)
    table[kind] = _reduce_bound_wrapper

    def undo() -> None:
        if previous is _MISSING:
            table.pop(kind, None)
        else:
            table[kind] = previous

    patcher.add_undo(undo, "copyreg reducer for patched methods")
