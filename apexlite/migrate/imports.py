"""The last pass: apex imports nothing uses any more go, amp kept for O2 is imported from apexlite by its
real name, and `import torch` is added when the new code needs it.

"Still used" is what the rewritten code reads, not what the original did: `from apex import amp`
disappears exactly when no amp call is left. What the rewritten code reads comes from Python's parser and
symbol tables of its text (apexlite.migrate.usage, cheap); the import edits are planned on the original
tree, whose import statements the first pass leaves where they were (one for one, in order), and applied
with the rest of the plan in one more pass over that tree, so the rewritten code is never parsed with
libcst again.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import Analysis, dotted_text
from apexlite.migrate.edits import Plan, small_statement
from apexlite.migrate.usage import Usage

ImportNode = Union[cst.Import, cst.ImportFrom]


def _imported_names(node: ImportNode) -> Tuple[str, ...]:
    if isinstance(node.names, cst.ImportStar):
        return ("*",)
    return tuple(_alias_name(alias) for alias in node.names)


def _alias_name(alias: cst.ImportAlias) -> str:
    return dotted_text(alias.name) or ""


class ImportPlanner:
    """Plans the import edits, on the original tree, for the rewritten code whose Usage is given."""

    def __init__(self, analysis: Analysis, keep_amp: bool, usage: Usage, keep_ddp: Optional[bool] = None) -> None:
        self.analysis = analysis
        self.plan = Plan(analysis)
        self.keep_amp = keep_amp
        self.keep_ddp = keep_amp if keep_ddp is None else keep_ddp  # apex's DDP -> ddp_from_apex_args
        self.usage = usage
        nodes = list(analysis.nodes((cst.Import, cst.ImportFrom)))
        matched = len(nodes) == len(usage.imports) and all(
            _imported_names(node) == found.names for node, found in zip(nodes, usage.imports))
        self.used = {node: found.used for node, found in zip(nodes, usage.imports)} if matched else {}

    def _used(self, node: ImportNode, alias: cst.ImportAlias) -> bool:
        """Whether the rewritten code reads the name this alias binds, where it binds it (when the import
        statements could not be matched to the rewritten code's, every one counts as used: nothing goes)."""
        used = self.used.get(node)
        return True if used is None else used[list(node.names).index(alias)]

    def _module(self, node: cst.ImportFrom) -> Optional[str]:
        if node.relative or node.module is None:
            return None
        return dotted_text(node.module)

    def _rewrite_import(self, node: cst.Import) -> Optional[List[str]]:
        """New statements (code) for `import ...`, or None to leave it."""
        kept, out, changed = [], [], False
        for alias in node.names:
            name = _alias_name(alias)
            if not apis.is_apex_name(name):
                kept.append(alias)
                continue
            if not self._used(node, alias):
                changed = True
                continue
            if self.keep_amp and name == apis.AMP_MODULE and alias.asname is not None:
                out.append(f"from apexlite import amp as {alias.asname.name.value}")
                changed = True
                continue
            kept.append(alias)
        if not changed:
            return None
        if kept:
            out.insert(0, "import " + ", ".join(self.analysis.code(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                                                for alias in kept))
        return out

    def _rewrite_from(self, node: cst.ImportFrom) -> Optional[List[str]]:
        module = self._module(node)
        if module is None or not apis.is_apex_name(module):
            return None
        if isinstance(node.names, cst.ImportStar):
            return None if self.usage.read & set(apis.star_names(module)) else []
        kept, moved = [], []
        changed = False
        for alias in node.names:
            name = f"{module}.{_alias_name(alias)}"
            text = self.analysis.code(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
            if not self._used(node, alias):
                changed = True
            elif self.keep_amp and name == apis.AMP_MODULE:
                moved.append(f"from apexlite import {text}")
                changed = True
            elif self.keep_amp and module == apis.AMP_MODULE and _alias_name(alias) in apis.apexlite_amp_names():
                moved.append(f"from apexlite.amp import {text}")
                changed = True
            elif self.keep_ddp and apis.canonical(name) == apis.APEX_DDP:  # see replacements.plan_replacements
                bound = alias.asname.name.value if alias.asname is not None else _alias_name(alias)
                moved.append(f"from apexlite.parallel import ddp_from_apex_args as {bound}")
                changed = True
            else:
                kept.append(text)
        if not changed:
            return None
        return ([f"from {module} import {', '.join(kept)}"] if kept else []) + moved

    def plan_all(self, needs_torch: bool) -> Plan:
        """The import edits alone (keyed by the original tree's nodes)."""
        rewrites: Dict[cst.BaseSmallStatement, List[str]] = {}
        for node in self.analysis.nodes((cst.Import, cst.ImportFrom)):
            new = self._rewrite_import(node) if isinstance(node, cst.Import) else self._rewrite_from(node)
            if new is not None:
                rewrites[node] = new
        anchor = self._torch_anchor() if needs_torch and not self._torch_bound() else None
        if isinstance(anchor, cst.BaseSmallStatement):
            rewrites.setdefault(anchor, None)
        for node, codes in rewrites.items():
            self.plan.replace_small(node, _edit(codes, node is anchor))
        if isinstance(anchor, cst.BaseStatement):
            self.plan.replace_statement(anchor, lambda updated: [cst.parse_statement("import torch\n"), updated])
        return self.plan

    def _torch_bound(self) -> bool:
        return "torch" in self.usage.module_bound

    def _torch_anchor(self) -> Union[cst.BaseSmallStatement, cst.BaseStatement, None]:
        """Where `import torch` goes: before the module's first import (after `__future__` ones), else before
        its first statement after the docstring."""
        body = list(self.analysis.module.body)
        for statement in body:
            if isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], (cst.Import,
                                                                                                 cst.ImportFrom)):
                first = statement.body[0]
                if isinstance(first, cst.ImportFrom) and self._module(first) == "__future__":
                    continue
                return first
        start = 1 if body and _is_docstring(body[0]) else 0
        while start < len(body) and isinstance(body[start], cst.SimpleStatementLine) and isinstance(
                body[start].body[0], cst.ImportFrom) and self._module(body[start].body[0]) == "__future__":
            start += 1
        if start >= len(body):
            return None
        statement = body[start]
        return statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else statement


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr) and isinstance(
        statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _edit(codes: Optional[Sequence[str]], with_torch: bool):
    def edit(updated: cst.BaseSmallStatement):
        produced = [small_statement(code) for code in codes] if codes is not None else [updated]
        return ([small_statement("import torch")] if with_torch else []) + produced

    return edit


def with_imports(plan: Plan, imports: Plan) -> Plan:
    """`plan` and the import edits in one plan (a copy). Only `import torch`, put before a statement the
    first pass also edits (a `from train import optimizer` that now imports the GradScaler too), meets
    another edit: then it goes before that edit's statements."""
    combined = replace(plan, small=dict(plan.small), statements=dict(plan.statements))
    for node, edit in imports.small.items():
        earlier = combined.small.get(node)
        combined.small[node] = edit if earlier is None else _torch_before(earlier)
    for node, statement_edit in imports.statements.items():
        earlier_statement = combined.statements.get(node)
        combined.statements[node] = statement_edit if earlier_statement is None else (
            lambda updated, earlier=earlier_statement: [cst.parse_statement("import torch\n"), *earlier(updated)])
    return combined


def _torch_before(edit):
    return lambda updated: [small_statement("import torch"), *edit(updated)]
