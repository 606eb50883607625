"""`python -m apexlite check PATH...`: which apex APIs scripts use and how apexlite handles each.

A PATH is a script, a Jupyter notebook (its code cells read as one program: apexlite.script_program) or
a folder of them (apexlite.script_paths); a file Python would not run is refused with one line. The
script is parsed, never executed. Every import of `apex`, `amp_C` or another of apex's top-level
modules (its compiled extensions: `fused_layer_norm_cuda`, `syncbn`, ...) is followed through aliases
(`from apex.parallel import DistributedDataParallel as DDP`, `import apex.amp as amp`,
`fused_layer_norm_cuda = importlib.import_module("fused_layer_norm_cuda")`, ...) to the attribute uses in
the code. Each API's status comes from `apexlite.api_status`, which reads apex's
module tree (apexlite/compat/apex_tree.tsv, the table MIGRATION.md agrees with): nothing is imported
from apexlite.compat to decide it. torch functions that O1 refuses for fp16/bf16 inputs
(`F.binary_cross_entropy`, `nn.BCELoss`) are flagged with the fix wherever they are used; torch is
looked at with its warnings silenced, so none is printed on check's account. The exit status is 1 when
any API used is unsupported, refused at import, or raises at O1; `--json` prints the report as JSON.
With several files, the files that use apex are listed, the rest counted, and the status is the highest.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from apexlite import api_status
from apexlite.compat import apex_tree
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS
from apexlite.script_paths import Collection, collect, skipped_summary
from apexlite.script_program import Program, load_program
from apexlite.script_source import MAX_SOURCE_BYTES, NotPythonSource, ScriptSourceError
from apexlite.wording import counted

EXIT_STATUSES = (
    (0, "every apex API used is supported (possibly with differences)"),
    (1, "some API used is unsupported, refused at import, or raises at O1"),
    (2, "usage error, or the script is missing or cannot be opened"),
    (3, "the file is not Python source Python would run (nor a Python notebook)"),
    (4, "the path is not a regular file or folder (device, FIFO, socket)"),
    (5, f"the file is larger than {MAX_SOURCE_BYTES} bytes"),
)
READS = ("PATH may be a script, a Jupyter notebook (its code cells, read as one program) or a folder (every\n"
         ".py and .ipynb under it, skipping hidden folders, environments, build and dist).")
_TRACKED_ROOTS = frozenset(LEGACY_TOP_LEVEL + REFUSED_EXTENSIONS + ("torch",))
_IMPORT_CALLS = frozenset({"importlib.import_module", "import_module", "__import__"})


@dataclass
class Usage:
    """One API and the lines that use it."""

    api: str
    lines: List[int] = field(default_factory=list)


class _ApiUses(ast.NodeVisitor):
    """Collects the apex/amp_C/torch names a module references, resolving import aliases."""

    def __init__(self, module: ast.Module) -> None:
        self.aliases: Dict[str, str] = _modules_bound_by_calls(module)  # local name -> qualified name
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

    def visit_Assign(self, node: ast.Assign) -> None:
        """`name = importlib.import_module("fused_layer_norm_cuda")`: name is that module from here on."""
        module = _imported_by_call(node.value)
        if module is None:
            self.generic_visit(node)
            return
        self._record(module, node.lineno)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.aliases[target.id] = module

    def visit_Call(self, node: ast.Call) -> None:
        module = _imported_by_call(node)
        if module is not None:
            self._record(module, node.lineno)
        self.generic_visit(node)

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


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _imported_by_call(node: ast.AST) -> Optional[str]:
    """The tracked module an `importlib.import_module("...")` / `__import__("...")` call imports, if any."""
    if not (isinstance(node, ast.Call) and node.args and _dotted(node.func) in _IMPORT_CALLS):
        return None
    name = node.args[0]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    return name.value if name.value.split(".")[0] in _TRACKED_ROOTS - {"torch"} else None


def _modules_bound_by_calls(module: ast.Module) -> Dict[str, str]:
    """name -> module for every `name = importlib.import_module("<tracked module>")` anywhere in the script.

    Known before the uses are walked: Megatron-style code binds the module in a constructor (under
    `global`) below the autograd Function that uses it."""
    bound = {}
    for node in ast.walk(module):
        imported = _imported_by_call(node.value) if isinstance(node, ast.Assign) else None
        if imported is not None:
            bound.update({target.id: imported for target in node.targets if isinstance(target, ast.Name)})
    return bound


def _star_exports(module: str) -> List[str]:
    """The names `from module import *` binds that check follows (none when apex has no such module)."""
    if module.split(".")[0] == "torch":  # only the O1-refused names matter in torch
        return [api.rsplit(".", 1)[1] for api in api_status.raising_at_o1() if api.rsplit(".", 1)[0] == module]
    tree = apex_tree.tree()
    row = tree.row(module)
    return tree.star_names(module) if row is not None and row.is_module else []


def status_of(api: str) -> Tuple[str, str]:
    """(API name as reported, status text) for one legacy apex / amp_C API (see api_status.status_of)."""
    return api_status.status_of(api)


def _quietly(fn: Callable[[], Any]) -> Any:
    """`fn()` with warnings silenced: torch's deprecation warnings are not about the script being read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def _refused_at_o1() -> Dict[int, str]:
    """id(torch object) -> its API name, for every torch API O1 refuses that this torch has."""
    objects = {api: _torch_object(api) for api in api_status.raising_at_o1()}
    return {id(obj): api for api, obj in objects.items() if obj is not None}


def _torch_object(api: str) -> Any:
    """The torch object a dotted name reaches by attribute access alone (no imports), or None."""

    def walk() -> Any:
        import torch

        obj: Any = torch
        for part in api.split(".")[1:]:
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj

    return _quietly(walk)


def scan(source: Any, filename: str = "<script>") -> List[Tuple[str, List[int], str]]:
    """(api, line numbers, status) for every apex API, and O1-refused torch API, used in `source`
    (text, bytes or an already parsed module), sorted by first use."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source, filename)
    visitor = _ApiUses(tree)
    visitor.visit(tree)
    refused = _refused_at_o1()
    merged: Dict[str, Tuple[List[int], str]] = {}
    for usage in visitor.uses.values():
        if usage.api.split(".")[0] == "torch":
            obj = _torch_object(usage.api)
            api = refused.get(id(obj)) if obj is not None else None
            if api is None:
                continue
            name, status = api, api_status.torch_status_text(api)
        else:
            name, status = status_of(usage.api)
        lines, _ = merged.get(name, ([], status))
        merged[name] = (sorted(set(lines + usage.lines)), status)
    return sorted(((name, lines, status) for name, (lines, status) in merged.items()), key=lambda r: r[1][0])


def _parser() -> argparse.ArgumentParser:
    epilog = "exit status:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_STATUSES)
    epilog += ("\n  with several files, the highest status of any of them\n\n" + READS)
    parser = argparse.ArgumentParser(prog="python -m apexlite check", epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="List the apex APIs scripts use and their status in apexlite "
                                                 "(the scripts are read, not run).")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a script, a notebook, or a folder of them")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def _counts(rows: List[Tuple[str, List[int], str]]) -> Dict[str, int]:
    return {kind: sum(status.split(":", 1)[0] == kind for _, _, status in rows) for kind in api_status.KINDS}


def _exit_status(rows: List[Tuple[str, List[int], str]]) -> int:
    return 1 if any(api_status.is_failing(status) for _, _, status in rows) else 0


def report(script: str, rows: List[Tuple[str, List[int], str]], program: Optional[Program] = None) -> Dict[str, Any]:
    """The JSON report: every API with its lines, status and note, the counts, and the exit status.
    In a notebook each line is [cell, line in that cell]."""
    apis = []
    for name, lines, status in rows:
        kind, _, note = status.partition(": ")
        where = [list(program.notebook.cell_of_line(line, program.source)) for line in lines] \
            if program is not None and program.notebook is not None else lines
        apis.append({"api": name, "lines": where, "status": kind, "note": note})
    return {"script": script, "apis": apis, "counts": _counts(rows), "exit_status": _exit_status(rows)}


def _print_text(script: str, rows: List[Tuple[str, List[int], str]], program: Optional[Program] = None) -> None:
    if not rows:
        print(f"{script}: no apex APIs used")
        return
    width = max(len(name) for name, _, _ in rows)
    print(f"{script}: {len(rows)} APIs to know about")
    for name, lines, status in rows:
        if program is not None and program.notebook is not None:
            where = ", ".join(program.location(line) for line in lines)
        else:
            where = "line " + ",".join(str(line) for line in lines)
        print(f"  {name:{width}}  {where}: {status}")
    counts = _counts(rows)
    summary = (f"{counts[api_status.SUPPORTED] + counts[api_status.DIFFERS]} supported or supported with "
               f"differences, {counts[api_status.UNSUPPORTED]} unsupported, {counts[api_status.REFUSED]} refused "
               "at import")
    if counts[api_status.RAISES_AT_O1]:
        summary += f", {counts[api_status.RAISES_AT_O1]} raise at O1 with fp16/bf16 inputs (see the fix above)"
    print(summary)


def _check_one(path: str) -> Tuple[Optional[Program], List[Tuple[str, List[int], str]], int, Optional[str]]:
    """(program, rows, exit status, error line) of one file."""
    try:
        program = load_program(path)
        return program, scan(program.source, path), 0, None
    except ScriptSourceError as error:
        return None, [], error.exit_status, str(error)
    except RecursionError:
        return None, [], NotPythonSource.exit_status, f"{path} is nested too deeply to analyse"


def _main_one(path: str, as_json: bool) -> int:
    program, rows, status, error = _check_one(path)
    if error is not None:
        sys.stderr.write(f"apexlite check: {error}\n")
        return status
    if as_json:
        print(json.dumps(report(path, rows, program), indent=2))
    else:
        _print_text(path, rows, program)
    return _exit_status(rows)


def _main_many(found: Collection, as_json: bool) -> int:
    """Every file's report (files without apex APIs only counted in text), a summary, the highest status."""
    reports, statuses, using, refused = [], [], 0, 0
    for target in found.targets:
        program, rows, status, error = _check_one(target.path)
        if error is None:
            status = _exit_status(rows)
            using += bool(rows)
        else:
            refused += 1
        statuses.append(status)
        if as_json:
            reports.append({"script": target.path, "error": error, "exit_status": status} if error is not None
                           else report(target.path, rows, program))
        elif error is not None:
            print(f"{target.path}: refused: {error}")
        elif rows:
            _print_text(target.path, rows, program)
    skipped = skipped_summary(found)
    exit_status = max(statuses, default=0)
    if as_json:
        print(json.dumps({"files": reports, "skipped": skipped, "exit_status": exit_status}, indent=2))
        return exit_status
    total = len(found.targets)
    print(f"total: {counted(total, 'file')} read: {using} use apex APIs, {total - using - refused} use none, "
          f"{refused} refused" + (f"; {skipped}" if skipped else ""))
    return exit_status


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite check`."""
    args = _parser().parse_args(argv)
    found = collect(args.paths)
    if not found.targets:
        sys.stderr.write(f"apexlite check: no Python scripts or notebooks (.py, .ipynb) under "
                         f"{', '.join(found.folders)}\n")
        return 2
    if not found.several:
        return _main_one(found.targets[0].path, args.json)
    return _main_many(found, args.json)
