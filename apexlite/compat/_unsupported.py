"""Placeholders for apex APIs apexlite does not provide: importable, but they raise when used.

Legacy scripts often import more than they call, so an unsupported name must not break the import;
using it must fail loudly with the alternative, never do nothing.
"""
from __future__ import annotations

import types
from typing import Any, Callable


class ApexliteUnsupportedError(NotImplementedError):
    """An apex API that apexlite deliberately does not implement was used."""


def unsupported_message(qualname: str, alternative: str) -> str:
    return f"{qualname} is not supported by apexlite. {alternative}"


def unsupported(qualname: str, alternative: str) -> Callable[..., Any]:
    """A callable (usable as a function or a class) that raises ApexliteUnsupportedError when called."""

    def placeholder(*args: Any, **kwargs: Any) -> Any:
        raise ApexliteUnsupportedError(unsupported_message(qualname, alternative))

    placeholder.__name__ = qualname.rsplit(".", 1)[-1]
    placeholder.__qualname__ = placeholder.__name__
    placeholder.__doc__ = unsupported_message(qualname, alternative)
    placeholder.apexlite_unsupported = True  # type: ignore[attr-defined]
    return placeholder


class UnsupportedModule(types.ModuleType):
    """A module every public attribute of which is an `unsupported` placeholder.

    Used for whole apex areas apexlite does not cover (apex.contrib, apex.transformer, ...), so
    `from apex.contrib.xentropy import SoftmaxCrossEntropyLoss` imports and fails at first use.
    """

    def __init__(self, name: str, alternative: str) -> None:
        super().__init__(name, f"Placeholder for {name}: not supported by apexlite. {alternative}")
        self.__path__: list = []  # a package, so deeper submodules resolve to placeholders too
        self._alternative = alternative

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return unsupported(f"{self.__name__}.{attr}", self._alternative)
