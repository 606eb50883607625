"""apex modules apexlite has no file for, built from the apex tree table (apexlite/compat/apex_tree.tsv).

`load(legacy_name)` gives apexlite's module for an apex module path:
- apexlite's own file under apexlite/compat/ when there is one (it implements the module, wholly or
  in part);
- else, for a module python-only apex imported and apexlite does not implement (most of
  apex.transformer, apex.contrib.sparsity, ...), one generic placeholder module made from the table
  instead of a file each: every public name the table lists is there, as a placeholder that raises
  ApexliteUnsupportedError with the table's note at use (a re-export is the very object it re-exports);
- else, for a module python-only apex refused to import (contrib kernels, apex.mlp, apex.RNN, ...), a
  `RefusedImport` (a ModuleNotFoundError) naming what it needs and the alternative, so `try/except
  ImportError` feature detection takes its fallback as it did with apex built without that extension.
Paths apex never had get the normal ModuleNotFoundError. Generic modules are registered in sys.modules
under their apexlite.compat name, like the files, so the import hook aliases them the same way.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import re
import sys
import types
from typing import Any, Callable, List

from apexlite.compat import apex_tree
from apexlite.compat._unsupported import unsupported, unsupported_class, unsupported_object
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL

COMPAT_PACKAGE = "apexlite.compat"
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def compat_name(legacy_name: str) -> str:
    return f"{COMPAT_PACKAGE}.{legacy_name}"


def advice(note: str) -> str:
    """A table note as a sentence of an error message."""
    note = note.strip()
    return (note[:1].upper() + note[1:] + ("" if note.endswith(".") else ".")) if note else ""


class RefusedImport(ModuleNotFoundError):
    """apexlite refuses to import an apex module, as python-only apex did (see `refusal`)."""


def refusal(legacy_name: str) -> RefusedImport:
    """The ImportError for refused module `legacy_name`: what it needs, and the table's alternative."""
    tree = apex_tree.tree()
    row = tree.row(legacy_name)
    note = advice(tree.status(legacy_name)[1])
    missing = _MISSING_MODULE.search(row.apex)
    needed = missing.group(1) if missing else None
    if needed == legacy_name:  # one of apex's compiled extensions, which apexlite does not implement
        message = (f"No module named {legacy_name!r}: apexlite does not implement apex's compiled extension "
                   f"{legacy_name} (an apex built without it had none either). {note}")
        return RefusedImport(message, name=legacy_name)
    if needed is not None and needed.partition(".")[0] in LEGACY_TOP_LEVEL:
        message = (f"{legacy_name} is refused by apexlite: apex needed its compiled extension {needed} here, which "
                   f"apexlite provides, but apexlite does not implement this module. {note}")
        return RefusedImport(message, name=legacy_name)
    if needed is not None:
        message = (f"No module named {needed!r}: {legacy_name} needs it and apexlite does not provide it "
                   f"(apex without it refused this import the same way). {note}")
        return RefusedImport(message, name=needed)
    if row.apex.startswith("absent at"):
        message = f"No module named {legacy_name!r}: it is not in apex any more ({row.apex}). {note}"
    else:
        message = f"{legacy_name} is refused by apexlite, as apex refused it ({row.apex}). {note}"
    return RefusedImport(message, name=legacy_name)


class PlaceholderModule(types.ModuleType):
    """An apex module apexlite does not implement: its public names appear on first access, as placeholders."""

    def __init__(self, legacy_name: str, is_package: bool) -> None:
        super().__init__(compat_name(legacy_name), f"{legacy_name}: importable as in apex; not implemented by "
                                                   f"apexlite, every name raises when used.")
        self.apexlite_legacy_name = legacy_name
        self.__spec__ = importlib.machinery.ModuleSpec(self.__name__, None, is_package=is_package)
        if is_package:
            self.__path__: List[str] = []
        self.__all__ = apex_tree.tree().star_names(legacy_name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = member(self.apexlite_legacy_name, attr)
        setattr(self, attr, value)
        return value

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | {row.name.rpartition(".")[2]
                                                for row in _bound_members(self.apexlite_legacy_name)})


def _bound_members(legacy_name: str) -> List[apex_tree.Row]:
    """The rows below a module that apex bound when it imported it (its names, not its submodules)."""
    return [row for row in apex_tree.tree().members(legacy_name) if not row.is_module and row.bound]


def member(legacy_module: str, attr: str) -> Any:
    """Attribute `attr` of the generic module `legacy_module`, made from its row (AttributeError if none)."""
    tree = apex_tree.tree()
    name = f"{legacy_module}.{attr}"
    row = tree.row(name)
    if row is not None and row.is_module:
        try:
            module = load(name)
        except ImportError as error:
            raise AttributeError(f"module {legacy_module!r} has no attribute {attr!r} ({error})") from None
        _publish_alias(legacy_module, name, module)
        return module
    if row is None or not row.bound:  # not apex's, or not bound when apex imported the module
        raise AttributeError(f"module {legacy_module!r} has no attribute {attr!r}")
    if row.same_as:
        return resolve(row.same_as)
    status, note = tree.status(name)
    if status != apex_tree.UNSUPPORTED:
        raise AttributeError(f"apexlite's apex tree lists {name} as {status}, but apexlite does not define it: "
                             f"the table and the package disagree (a bug; please report it).")
    if row.kind == "class":
        return unsupported_class(name, advice(note))
    if row.kind == "function":
        return unsupported(name, advice(note))
    return unsupported_object(name, advice(note))


def _publish_alias(parent: str, name: str, module: types.ModuleType) -> None:
    """A submodule reached as an attribute (`apex.transformer`, which apex's __init__ imported) is in
    sys.modules under apex's name too, as in apex, when the active alias hook serves its parent."""
    if sys.modules.get(parent) is not sys.modules.get(compat_name(parent)):
        return
    for finder in sys.meta_path:
        publish = getattr(finder, "publish_alias", None)
        if callable(publish):
            publish(name, module)
            return


def resolve(legacy_name: str) -> Any:
    """The object apexlite has for an apex module path or name."""
    row = apex_tree.tree().row(legacy_name)
    if row is None or row.is_module:
        return load(legacy_name)
    parent, _, attr = legacy_name.rpartition(".")
    return getattr(load(parent), attr)


def load(legacy_name: str) -> types.ModuleType:
    """apexlite's module for apex module `legacy_name` (see the module docstring); raises ImportError."""
    real = compat_name(legacy_name)
    if real in sys.modules:
        return sys.modules[real]
    try:
        return importlib.import_module(real)
    except ModuleNotFoundError as error:
        if error.name is None or not (real == error.name or real.startswith(error.name + ".")):
            raise  # a module apexlite has failed inside: that error is the answer
    tree = apex_tree.tree()
    row = tree.row(legacy_name)
    if row is None or not row.is_module:
        raise ModuleNotFoundError(f"No module named {legacy_name!r}", name=legacy_name)
    status, _ = tree.status(legacy_name)
    if status == apex_tree.REFUSED:
        raise refusal(legacy_name)
    if status != apex_tree.UNSUPPORTED:
        raise ImportError(f"apexlite's apex tree lists {legacy_name} as {status}, but apexlite has no module "
                          f"{real}: the table and the package disagree (a bug; please report it).")
    parent_name, _, leaf = legacy_name.rpartition(".")
    parent = load(parent_name) if parent_name else None
    module = PlaceholderModule(legacy_name, row.kind == "package")
    sys.modules[real] = module
    if parent is not None:
        setattr(parent, leaf, module)
    return module


def fallback_getattr(module_name: str) -> Callable[[str], Any]:
    """A module `__getattr__` for apexlite's files that implement an apex module in part.

    The names apex's module has and the file does not define come from the table, on first access: a
    re-export is the very object it re-exports, anything else a placeholder that raises at use. Each is
    then kept on the module, so every access gives the same object.
    """
    legacy = module_name[len(COMPAT_PACKAGE) + 1:]

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        value = member(legacy, attr)
        setattr(sys.modules[module_name], attr, value)
        return value

    return __getattr__
