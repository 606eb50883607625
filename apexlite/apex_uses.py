"""Which apex APIs a Python program uses, and how apexlite handles each: the scan behind `apexlite check`
(and what `migrate` says is left of apex after a rewrite).

The program is parsed, never executed. Every import of `apex`, `amp_C` or another of apex's top-level
modules (its compiled extensions: `fused_layer_norm_cuda`, `syncbn`, ...) is followed through aliases
(`from apex.parallel import DistributedDataParallel as DDP`, `import apex.amp as amp`,
`fused_layer_norm_cuda = importlib.import_module("fused_layer_norm_cuda")`, ...) to the attribute uses in
the code. Each API's status comes from `apexlite.api_status`, which reads apex's module tree
(apexlite/compat/apex_tree.tsv, the table MIGRATION.md agrees with): nothing is imported from
apexlite.compat to decide it. torch functions that O1 refuses for fp16/bf16 inputs
(`F.binary_cross_entropy`, `nn.BCELoss`) are found wherever they are used; torch is looked at with its
warnings silenced, so none is printed on the scan's account.
"""
from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from apexlite import api_status, initialize_scan
from apexlite.compat import apex_tree
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL, REFUSED_EXTENSIONS

Row = Tuple[str, List[int], str]  # (API name as reported, line numbers, status text)
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


def scan(source: Any, filename: str = "<script>") -> List[Row]:
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
    rows = [(name, lines, status) for name, (lines, status) in merged.items()]
    return sorted(rows + initialize_scan.problems(tree, visitor.aliases), key=lambda r: r[1][0])
