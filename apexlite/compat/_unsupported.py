"""Placeholders for apex APIs apexlite does not provide: importable, but they raise when used.

Legacy scripts often import more than they call, so an unsupported name must not break the import;
using it must fail loudly with the alternative, never do nothing. Class placeholders are real
classes, so `isinstance`, `issubclass` and subclassing work at import time and only instantiation
raises; function placeholders raise when called.
"""
from __future__ import annotations

import types
from typing import Any, Callable, Dict, Tuple


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
    placeholder.__doc__ = unsupported_message(qualname, alternative)
    placeholder.apexlite_unsupported = True  # type: ignore[attr-defined]
    return placeholder


def unsupported_class(qualname: str, alternative: str, bases: Tuple[type, ...] = (object,)) -> type:
    """A class that raises ApexliteUnsupportedError when it (or a subclass) is instantiated.

    `bases` lets the placeholder sit where apex's class sat in a hierarchy (e.g. a torch Optimizer),
    so `isinstance(x, torch.optim.Optimizer)`-style checks in user code stay meaningful.
    """
    message = unsupported_message(qualname, alternative)

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(message)

    name = _short_name(qualname)
    namespace: Dict[str, Any] = {
        "__new__": __new__, "__doc__": message, "__module__": qualname.split(" ", 1)[0].rpartition(".")[0],
        "apexlite_unsupported": True,
    }
    return type(name, bases, namespace)


class UnsupportedModule(types.ModuleType):
    """A module every public attribute of which is an unsupported placeholder class.

    Used for whole apex areas apexlite does not cover (apex.contrib, apex.transformer, ...), so
    `from apex.contrib.xentropy import SoftmaxCrossEntropyLoss` imports and fails at first use. Each
    attribute is created once and kept, so two imports of a name give the same object; it is a class
    whether apex had a class or a function there, since a class also raises when called.
    """

    def __init__(self, name: str, alternative: str) -> None:
        super().__init__(name, f"Placeholder for {name}: not supported by apexlite. {alternative}")
        self.__path__: list = []  # a package, so deeper submodules resolve to placeholders too
        self._alternative = alternative

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        placeholder = unsupported_class(f"{self.__name__}.{attr}", self._alternative)
        setattr(self, attr, placeholder)
        return placeholder
