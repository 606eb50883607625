"""Placeholders for apex names apexlite does not implement: importable, but they raise when used.

python-only apex imported many modules whose names needed a compiled extension only when used; apexlite
keeps those names importable the same way and makes every use fail loudly with the alternative, never do
nothing. Class placeholders are real classes, so `isinstance`, `issubclass` and subclassing work at
import time; instantiating one, or reading a public attribute of it (`FastLayerNormFN.apply`,
`AttnMaskType.causal`), raises. Function placeholders raise when called; object placeholders (apex's
module-level objects and constants) raise on any use but `repr`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch


class ApexliteUnsupportedError(NotImplementedError):
    """An apex API that apexlite deliberately does not implement was used."""


def unsupported_message(qualname: str, alternative: str) -> str:
    return f"{qualname} is not supported by apexlite. {alternative}"


def _short_name(qualname: str) -> str:
    """`apex.optimizers.FP16_Optimizer (the pre-2019 ...)` -> `FP16_Optimizer`."""
    return qualname.split(" ", 1)[0].rsplit(".", 1)[-1]


def unsupported(qualname: str, alternative: str) -> Callable[..., Any]:
    """A function that raises ApexliteUnsupportedError when called (for apex functions)."""

    def placeholder(*args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(unsupported_message(qualname, alternative))

    placeholder.__name__ = _short_name(qualname)
    placeholder.__qualname__ = placeholder.__name__
    placeholder.__module__ = qualname.split(" ", 1)[0].rpartition(".")[0]
    placeholder.__doc__ = unsupported_message(qualname, alternative)
    placeholder.apexlite_unsupported = True  # type: ignore[attr-defined]
    return placeholder


class _PlaceholderMeta(type):
    """Metaclass of class placeholders: a public class attribute they lack raises the placeholder's error."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("_"):  # protocol probes (pickle, typing, inspect) keep their AttributeError
            raise AttributeError(attr)
        raise ApexliteUnsupportedError(cls.__doc__)


_METACLASSES: Dict[type, type] = {type: _PlaceholderMeta}


def _metaclass_for(bases: Tuple[type, ...]) -> type:
    """_PlaceholderMeta combined with the bases' own metaclass (torch.autograd.Function has one)."""
    base_meta = type(bases[0]) if bases else type
    if base_meta not in _METACLASSES:
        _METACLASSES[base_meta] = type(f"Placeholder{base_meta.__name__}", (_PlaceholderMeta, base_meta), {})
    return _METACLASSES[base_meta]


def unsupported_class(qualname: str, alternative: str, bases: Tuple[type, ...] = (object,)) -> type:
    """A class that raises ApexliteUnsupportedError when it (or a subclass) is instantiated.

    `bases` lets the placeholder sit where apex's class sat in a hierarchy (e.g. a torch Optimizer),
    so `isinstance(x, torch.optim.Optimizer)`-style checks in user code stay meaningful.
    """
    message = unsupported_message(qualname, alternative)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(message)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(message)

    name = _short_name(qualname)
    namespace: Dict[str, Any] = {
        "__new__": __new__, "__doc__": message, "__module__": qualname.split(" ", 1)[0].rpartition(".")[0],
        "apexlite_unsupported": True,
    }
    if any(issubclass(base, torch.autograd.Function) for base in bases):  # `.apply` runs forward
        namespace.update(forward=staticmethod(refuse), backward=staticmethod(refuse))
    return _metaclass_for(bases)(name, bases, namespace)


class UnsupportedObject:
    """Stands for one of apex's module-level objects or constants: any use raises, `repr` says what it is."""

    apexlite_unsupported = True

    def __init__(self, qualname: str, alternative: str) -> None:
        object.__setattr__(self, "_message", unsupported_message(qualname, alternative))

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(object.__getattribute__(self, "_message"))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        self._refuse()

    def __repr__(self) -> str:
        return f"<placeholder: {object.__getattribute__(self, '_message')}>"

    __call__ = __iter__ = __len__ = __bool__ = __getitem__ = __setitem__ = __contains__ = __setattr__ = _refuse
    __str__ = __int__ = __float__ = __index__ = __enter__ = _refuse


def unsupported_object(qualname: str, alternative: str) -> UnsupportedObject:
    """A placeholder for an apex module-level object or constant."""
    return UnsupportedObject(qualname, alternative)


def is_placeholder(value: Any) -> bool:
    """Whether `value` is one of these placeholders (a class, function or object that raises at use)."""
    if isinstance(value, (UnsupportedObject, _PlaceholderMeta)):
        return True
    namespace = getattr(value, "__dict__", None)
    return isinstance(namespace, dict) and namespace.get("apexlite_unsupported", False) is True
