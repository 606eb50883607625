"""The wrapt wrappers O1 patches install, and what a plain function supports besides a call.

wrapt's proxies refuse pickling and copying ("object proxy must define __reduce__()"), which broke a
spawn DataLoader given `collate_fn=torch.stack`, and nn.TransformerEncoder deep-copying a layer that
holds F.gelu. Each patch records where it is installed (LOCATION) and pickles as a reference to that
place, the way Python pickles a function by its qualified name:
`pickle.loads(pickle.dumps(torch.mm)) is torch.mm` wherever O1 is active (this process, or a worker
that called `amp.initialize` before unpickling), and torch's own function wherever it is not (a
spawn worker without amp, or after `deinitialize`). The bytes name only torch and the standard library.
- A module's function (torch.stack, F.gelu): O1FunctionWrapper, pickled as getattr(module, name);
  copy.copy / copy.deepcopy return it, as they return a function.
- A class's method (torch.Tensor.mm): O1MethodWrapper on the class, pickled as
  inspect.getattr_static(class, name) (the stored wrapper itself, or the original where nothing is
  patched). Every read from a tensor or from the class binds an O1BoundMethod, pickled as
  getattr(that tensor or class, name), copied as plain torch copies the method it stands for.
  (A subclass of wrapt's FunctionWrapper costs one attribute lookup per Tensor-method read, about
  0.1 µs; copy.copy looks up `__copy__` on the type, so only a subclass can make a binding copyable.)
"""
from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import sys
import types
from typing import Any, Callable, Optional, Tuple

import wrapt

LOCATION = "_self_apexlite_location"  # on a patch: (module or class, attribute name) it is installed at
_NAMED_WHERE_INSTALLED = frozenset({"__module__", "__name__"})


class _ModuleReference:
    """Unpickles as `importlib.import_module(name)`, so a reference can name a module's attribute."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple:
        return importlib.import_module, (self.name,)


def _owner_reference(owner: Any, name: str) -> Any:
    """What a pickle names `owner` by: a class as itself (pickled by its qualified name), a module by
    its import name. Anything else has no name to be found under in another process."""
    if isinstance(owner, type):
        return owner
    if isinstance(owner, types.ModuleType) and sys.modules.get(owner.__name__) is owner:
        return _ModuleReference(owner.__name__)
    raise pickle.PicklingError(
        f"cannot pickle the O1 wrapper of {name!r} by reference: it is patched on {owner!r}, which is neither "
        f"a class nor a module importable by its name. Register functions of modules or classes."
    )


def _location(wrapper: Any) -> Tuple[Any, str]:
    location = getattr(wrapper, LOCATION, None)
    if location is None:  # a decorator's wrapper, installed nowhere: named where the function is defined
        return _defining_location(wrapper.__wrapped__)
    return location


def _defining_location(function: Any) -> Tuple[Any, str]:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    try:
        owner_path, _, name = qualname.rpartition(".")
        owner = importlib.import_module(module)
        for part in owner_path.split(".") if owner_path else ():
            owner = getattr(owner, part)
        if getattr(owner, name) is not function:
            raise AttributeError(name)
    except (AttributeError, ImportError, TypeError) as exc:
        raise pickle.PicklingError(f"cannot pickle {function!r} by reference: {module}.{qualname} does not "
                                   f"name it") from exc
    return owner, name


class _PicklesByReference:
    """What O1's wrappers share: `__reduce__` defers to the class's `__reduce_ex__` (wrapt's proxies
    refuse both), and a copy is the wrapper itself, as for a function."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return self.__reduce_ex__(pickle.DEFAULT_PROTOCOL)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict) -> Any:
        return self


class O1FunctionWrapper(_PicklesByReference, wrapt.FunctionWrapper):
    """A patched module function: pickles as getattr(module, name), copies as itself, and is named where it is
    installed (`__module__`, `__name__`): code that calls a function by its qualified name reaches the patch
    (torch.fx writes `torch.nn.functional.linear` into the code of a compiled graph, where the original builtin
    would have named `torch._C._nn.linear`, which O1 leaves as it is)."""

    def __getattribute__(self, name: str) -> Any:
        # wrapt's proxy reads these from the wrapped function (its pure-Python version also copies its own
        # properties over a subclass's), so they are answered here
        if name in _NAMED_WHERE_INSTALLED:
            installed = O1FunctionWrapper._installed_at(self)
            if installed is not None:
                return installed[0].__name__ if name == "__module__" else installed[1]
        return super().__getattribute__(name)

    def _installed_at(self) -> Optional[Tuple[Any, str]]:
        location = getattr(self, LOCATION, None)
        return location if location is not None and isinstance(location[0], types.ModuleType) else None

    def __reduce_ex__(self, protocol: int) -> tuple:
        owner, name = _location(self)
        return getattr, (_owner_reference(owner, name), name)


class O1BoundMethod(_PicklesByReference, wrapt.BoundFunctionWrapper):
    """A patched method read from a tensor (or from its class): pickles as getattr(tensor or class, name)."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: int) -> tuple:
        owner, name = getattr(self._self_parent, LOCATION)
        instance = self._self_instance
        return getattr, (_owner_reference(owner, name) if instance is None else instance, name)

    def __deepcopy__(self, memo: dict) -> Any:
        """As plain torch deep-copies the method: a builtin's stays itself, a Python method's is bound
        to a deep copy of its tensor (and is then the patched method of that copy)."""
        original = self.__wrapped__
        copied = copy.deepcopy(original, memo)
        if copied is original:
            return self
        return getattr(copied.__self__, getattr(self._self_parent, LOCATION)[1])


class O1MethodWrapper(_PicklesByReference, wrapt.FunctionWrapper):
    """A patched method as stored on its class: pickles as inspect.getattr_static(class, name), copies as itself."""

    __bound_function_wrapper__ = O1BoundMethod

    def __reduce_ex__(self, protocol: int) -> tuple:
        owner, name = getattr(self, LOCATION)
        return inspect.getattr_static, (owner, name)


def make_function_wrapper(original: Callable, wrapper: Callable,
                          location: Optional[Tuple[Any, str]]) -> wrapt.FunctionWrapper:
    """The wrapt wrapper of `original` to install at `location` (None: installed nowhere, a decorator's)."""
    on_a_class = location is not None and isinstance(location[0], type)
    patched = O1MethodWrapper(original, wrapper) if on_a_class else O1FunctionWrapper(original, wrapper)
    setattr(patched, LOCATION, location)
    return patched
