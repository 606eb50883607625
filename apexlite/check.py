"""`python -m apexlite check SCRIPT`: which apex APIs a script uses and how apexlite handles each.

The script is parsed, never executed. Every `apex` / `amp_C` import is followed through aliases
(`from apex.parallel import DistributedDataParallel as DDP`, `import apex.amp as amp`, ...) to the
attribute uses in the code. Each API's status comes from `apexlite.api_status` (the table MIGRATION.md
agrees with), else from what it resolves to in apexlite.compat: an implementation is "supported", a
placeholder or nothing is "unsupported". torch functions that O1 refuses for fp16/bf16 inputs
(`F.binary_cross_entropy`, `nn.BCELoss`) are flagged with the fix wherever they are used.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from apexlite import api_status
from apexlite.compat.hook import target_name
from apexlite.script_source import MAX_SOURCE_BYTES, ScriptSourceError, parse_script

EXIT_STATUSES = (
    (0, "every apex API used is supported (possibly with differences)"),
    (1, "some apex API used is unsupported"),
    (2, "usage error, or the script is missing or cannot be opened"),
    (3, "the file is not Python source Python would run"),
    (4, "the path is not a regular file (directory, device, FIFO, socket)"),
    (5, f"the file is larger than {MAX_SOURCE_BYTES} bytes"),
)
_TRACKED_ROOTS = ("apex", "amp_C", "torch")
_UNKNOWN = "unsupported: not part of apex's legacy API as apexlite provides it (check the spelling)"


@dataclass
class Usage:
    """One API and the lines that use it."""

    api: str
    lines: List[int] = field(default_factory=list)


def _is_legacy(name: str) -> bool:
    return target_name(name) is not None


class _ApiUses(ast.NodeVisitor):
    """Collects the apex/amp_C/torch names a module references, resolving import aliases."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # local name -> qualified name
        self.uses: Dict[str, Usage] = {}

    def _record(self, api: str, line: int) -> None:
        self.uses.setdefault(api, Usage(api)).lines.append(line)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in _TRACKED_ROOTS:
                continue
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
            self._record(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module.split(".")[0] not in _TRACKED_ROOTS:
            return
        for alias in node.names:
            if alias.name == "*":
                self._record(module, node.lineno)
                self.aliases.update({name: f"{module}.{name}" for name in _star_exports(module)})
                continue
            qualified = f"{module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = qualified
            self._record(qualified, node.lineno)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain: List[str] = []
        current: ast.AST = node
        while isinstance(current, ast.Attribute):
            chain.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id in self.aliases:
            attrs = list(reversed(chain))
            while attrs and attrs[-1].startswith("__"):
                attrs.pop()  # `apex.__version__`, `amp.__name__`: the module itself is what is used
            self._record(".".join([self.aliases[current.id], *attrs]), node.lineno)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.aliases and isinstance(node.ctx, ast.Load):
            self._record(self.aliases[node.id], node.lineno)


def _star_exports(module: str) -> List[str]:
    """The names `from module import *` binds that check follows (none when the module does not exist)."""
    if module.split(".")[0] == "torch":  # only the O1-refused names matter in torch
        return [api.rsplit(".", 1)[1] for api in api_status.raising_at_o1() if api.rsplit(".", 1)[0] == module]
    if api_status.lookup(module) is not None and api_status.lookup(module).members:
        return []
    _, obj = _resolve(module)
    if not isinstance(obj, types.ModuleType):
        return []
    names = getattr(obj, "__all__", None)
    if names is None:  # like Python: public names; keep those apexlite defines, not its imports (torch, typing)
        names = [name for name in dir(obj) if not name.startswith("_") and _defined_by_apexlite(getattr(obj, name))]
    return list(names)


def _defined_by_apexlite(value: Any) -> bool:
    origin = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "") or ""
    return origin.split(".")[0] in ("apexlite", "apex", "amp_C")


def _import_compat(legacy: str) -> Optional[types.ModuleType]:
    try:
        return importlib.import_module(target_name(legacy))
    except Exception:  # noqa: BLE001 -- a module that fails to import is reported as unavailable
        return None


def _resolve(api: str) -> Tuple[str, Any]:
    """(the API name at the depth that matters, the compat object it resolves to or None).

    Attributes are followed from the top-level module down, importing a submodule only when no
    attribute of that name exists (as `import a.b` would); the walk stops at the first object that
    is not a module (`amp.initialize`, `amp._amp_state`), since deeper access is that object's API.
    """
    parts = api.split(".")
    obj: Any = _import_compat(parts[0])
    for index in range(1, len(parts)):
        if not isinstance(obj, types.ModuleType):
            return ".".join(parts[:index]), obj
        attr = getattr(obj, parts[index], None)
        if attr is None:
            attr = _import_compat(".".join(parts[:index + 1]))
            if attr is None:
                return ".".join(parts[:index + 1]), None
        obj = attr
    return api, obj


def status_of(api: str) -> Tuple[str, str]:
    """(API name as reported, status text) for one legacy apex / amp_C API."""
    row = api_status.lookup(api)
    if row is not None and row.members:
        return ".".join(api.split(".")[:row.api.count(".") + 2]), row.text
    name, obj = _resolve(api)
    row = api_status.lookup(name)
    if row is not None:
        return name, row.text
    if obj is None:
        return name, _UNKNOWN
    if getattr(obj, "apexlite_unsupported", False):
        return name, "unsupported: " + obj.__doc__.split(" is not supported by apexlite. ", 1)[-1]
    return name, api_status.SUPPORTED


def _refused_at_o1() -> Dict[int, str]:
    """id(torch object) -> its row's API name, for every torch API O1 refuses."""
    import torch

    found = {}
    for api in api_status.raising_at_o1():
        obj: Any = torch
        for part in api.split(".")[1:]:
            obj = getattr(obj, part)
        found[id(obj)] = api
    return found


def _torch_object(api: str) -> Any:
    """The torch object a dotted name reaches by attribute access alone (no imports), or None."""
    import torch

    obj: Any = torch
    for part in api.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def scan(source: Any, filename: str = "<script>") -> List[Tuple[str, List[int], str]]:
    """(api, line numbers, status) for every apex API, and O1-refused torch API, used in `source`
    (text, bytes or an already parsed module), sorted by first use."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source, filename)
    visitor = _ApiUses()
    visitor.visit(tree)
    refused = _refused_at_o1()
    merged: Dict[str, Tuple[List[int], str]] = {}
    for usage in visitor.uses.values():
        if usage.api.split(".")[0] == "torch":
            api = refused.get(id(_torch_object(usage.api)))
            if api is None:
                continue
            name, status = api, api_status.lookup(api).text
        else:
            name, status = status_of(usage.api)
        lines, _ = merged.get(name, ([], status))
        merged[name] = (sorted(set(lines + usage.lines)), status)
    return sorted(((name, lines, status) for name, (lines, status) in merged.items()), key=lambda r: r[1][0])


def _parser() -> argparse.ArgumentParser:
    epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES)
    parser = argparse.ArgumentParser(prog="python -m apexlite check", epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="List the apex APIs a script uses and their status in apexlite "
                                                 "(the script is read, not run).")
    parser.add_argument("script")
    return parser


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite check`."""
    args = _parser().parse_args(argv)
    try:
        rows = scan(parse_script(args.script), args.script)
    except ScriptSourceError as error:
        sys.stderr.write(f"apexlite check: {error}\n")
        return error.exit_status
    except RecursionError:
        sys.stderr.write(f"apexlite check: {args.script} is nested too deeply to analyse\n")
        return 3
    if not rows:
        print(f"{args.script}: no apex APIs used")
        return 0
    width = max(len(name) for name, _, _ in rows)
    print(f"{args.script}: {len(rows)} APIs to know about")
    for name, lines, status in rows:
        where = ",".join(str(line) for line in lines)
        print(f"  {name:{width}}  line {where}: {status}")
    counts = {kind: sum(status.startswith(kind) for _, _, status in rows) for kind in api_status.KINDS}
    summary = (f"{counts[api_status.SUPPORTED] + counts[api_status.DIFFERS]} supported or supported with "
               f"differences, {counts[api_status.UNSUPPORTED]} unsupported")
    if counts[api_status.RAISES_AT_O1]:
        summary += f", {counts[api_status.RAISES_AT_O1]} raise at O1 with fp16/bf16 inputs (see the fix above)"
    print(summary)
    return 1 if counts[api_status.UNSUPPORTED] else 0
