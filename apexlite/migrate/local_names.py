"""The names one Python scope binds, read from the standard `ast` (for the definite-assignment check in
apexlite.migrate.soundness): assignments, imports, defs and classes by their own name, except-handler,
match and walrus targets; names declared `global`/`nonlocal` are kept apart. Nested scopes are not entered.
"""
from __future__ import annotations

import ast
from typing import List, Set


def target_names(target: ast.AST) -> List[str]:
    """Names a store target binds (`a`, `a, (b, *c)`); attributes and subscripts bind none."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in target_names(element)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


class LocalNames(ast.NodeVisitor):
    """The names a scope binds (its own statements; nested scopes only by their own name)."""

    def __init__(self) -> None:
        self.bound: Set[str] = set()
        self.declared: Set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bound.add(node.id)

    def _named(self, node) -> None:
        self.bound.add(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)

    def visit_FunctionDef(self, node) -> None:
        self._named(node)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._named(node)
        for base in [*node.bases, *(keyword.value for keyword in node.keywords)]:
            self.visit(base)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)

    def _comprehension(self, node) -> None:  # only walrus targets leak out of a comprehension
        for inner in ast.walk(node):
            if isinstance(inner, ast.NamedExpr) and isinstance(inner.target, ast.Name):
                self.bound.add(inner.target.id)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.bound.add(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Global(self, node) -> None:
        self.declared.update(node.names)

    visit_Nonlocal = visit_Global

    def visit_MatchAs(self, node) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node) -> None:
        if node.name:
            self.bound.add(node.name)

    def visit_MatchMapping(self, node) -> None:
        if node.rest:
            self.bound.add(node.rest)
        self.generic_visit(node)


def scope_body(node: ast.AST) -> List[ast.AST]:
    """The statements of a def, class or module (a lambda's one expression)."""
    if isinstance(node, ast.Lambda):
        return [node.body]
    return list(node.body)
