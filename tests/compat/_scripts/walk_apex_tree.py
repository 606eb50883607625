"""Walks the apex tree table's rows of one area against the modules, in a fresh interpreter, under the hook.

    python walk_apex_tree.py AREA      (AREA: "apex.amp", "apex" for apex's top-level rows, ..., "extensions"
                                        for apex's compiled extension modules: amp_C, fused_layer_norm_cuda, ...)

Prints one JSON line `RESULTS {row name: problem}`; an empty problem means the row holds:
- a module python-only apex imported (status supported / differs / unsupported) imports, and so does
  each submodule; a refused one raises a ModuleNotFoundError that names the alternative, and
  `try/except ImportError` takes its fallback; its names are covered by that refusal;
- each name apex bound is there, of the kind the table says (class, function, module), the very
  object of the row it is `same_as`; a working name (supported / differs) is no placeholder; an
  unsupported one raises ApexliteUnsupportedError naming the alternative when used.
"""
from __future__ import annotations

import importlib
import json
import sys
import types
import warnings
from typing import Any, Dict

from apexlite.compat import apex_tree, hook
from apexlite.compat._unsupported import ApexliteUnsupportedError, is_placeholder
from apexlite.compat.generic import advice


def area_of(name: str) -> str:
    """The walk a row belongs to: its module's first two components (`apex.amp`), `apex`, or `extensions`
    for apex's top-level extension modules and their functions (each its own module: one walk for all)."""
    tree = apex_tree.tree()
    row = tree.row(name)
    module = row.name if row.is_module else tree.enclosing_module(row.parent).name
    return "extensions" if module.split(".")[0] != "apex" else ".".join(module.split(".")[:2])


def resolve(name: str) -> Any:
    tree = apex_tree.tree()
    if tree.row(name).is_module:
        return importlib.import_module(name)
    parent, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(parent), attr)


def use(value: Any, kind: str) -> None:
    """Use a name the way code would: instantiate a class, call a function, test an object."""
    if kind in ("class", "function"):
        value()
    else:
        bool(value)


def check_refused(name: str, note: str) -> str:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if advice(note) not in str(error):
            return f"the ImportError does not name the alternative: {error}"
    except ImportError as error:
        return f"raises {type(error).__name__}, not a ModuleNotFoundError: {error}"
    else:
        return "imports, but apexlite refuses it"
    namespace: Dict[str, Any] = {}
    exec(f"try:\n    import {name}\n    found = True\nexcept ImportError:\n    found = False\n", namespace)
    return "try/except ImportError did not take the fallback" if namespace["found"] else ""


def check_member(module: types.ModuleType, row: apex_tree.Row) -> str:
    tree = apex_tree.tree()
    attr = row.name.rpartition(".")[2]
    try:
        value = getattr(module, attr)
    except Exception as error:  # noqa: BLE001 -- any failure to get the name is the finding
        return f"missing: {type(error).__name__}: {error}"
    expected = {"class": isinstance(value, type), "function": callable(value) and not isinstance(value, type),
                "submodule": isinstance(value, types.ModuleType)}.get(row.kind, True)
    if not expected:
        return f"is {type(value).__name__}, the table says {row.kind}"
    if row.same_as:
        try:
            target = resolve(row.same_as)
        except Exception as error:  # noqa: BLE001
            return f"its same_as {row.same_as} does not resolve: {type(error).__name__}: {error}"
        if value is not target:
            return f"is not the same object as {row.same_as}"
    if row.kind == "submodule":
        return ""  # the module's own row is walked in its area
    status, note = tree.status(row.name)
    if status in apex_tree.WORKING:
        return "is a placeholder, the table says it works" if is_placeholder(value) else ""
    if not is_placeholder(value):
        return f"the table says {status}, but it is an implementation"
    try:
        use(value, row.kind)
    except ApexliteUnsupportedError as error:
        return "" if advice(note) in str(error) else f"its error does not name the alternative: {error}"
    return "used without raising ApexliteUnsupportedError"


def walk(area: str) -> Dict[str, str]:
    tree = apex_tree.tree()
    results: Dict[str, str] = {}
    for row in sorted(tree.modules(), key=lambda r: r.name):
        if area_of(row.name) != area:
            continue
        status, note = tree.status(row.name)
        members = [m for m in tree.members(row.name) if not m.is_module]
        if status == apex_tree.REFUSED:
            outer = tree.outermost_refused(row.name)
            results[row.name] = check_refused(row.name, note) if outer is row else results[outer.name]
            results.update({m.name: results[row.name] for m in members})
            continue
        try:
            module = importlib.import_module(row.name)
        except Exception as error:  # noqa: BLE001
            results[row.name] = f"does not import: {type(error).__name__}: {error}"
            results.update({m.name: f"its module does not import: {error}" for m in members})
            continue
        results[row.name] = "" if isinstance(module, types.ModuleType) else f"imports a {type(module).__name__}"
        for member in members:
            results[member.name] = check_member(module, member) if member.bound else ""
    return results


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    hook.install()
    print("RESULTS " + json.dumps(walk(sys.argv[1])))
