"""Which names of its import statements the rewritten code still reads, scope by scope, from Python's own
parser and symbol tables (cheap next to parsing the rewritten code with libcst again).

An import binds its name in the scope it runs in (a function's import in that function); the name is used
when that scope reads it, or a scope nested in it reads it without binding its own (a class body's names
are not seen from its methods); an import inside an `if`, `try` or loop only where code that can run after
it reads the name (not the other branch, whose own import binds it there). Names in annotations count as read even under `from __future__ import
annotations` (the symbol tables skip those), string annotations included, and so do the type names in
the strings given to `cast`, `TypeVar` and `NewType`. The import statements come in
source order, so the import pass can match them one for one to the original tree's.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import symtable
from dataclasses import dataclass
from typing import Iterator, List, Optional, Set, Tuple

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPING_CALLS = ("cast", "TypeVar", "NewType")  # calls whose string arguments name types
Chain = Tuple[Tuple[str, int], ...]  # the (name, line) of each function or class around a statement


@dataclass(frozen=True)
class ImportUse:
    """One import statement of the rewritten code: its modules and, per name it imports, whether it is read."""

    names: Tuple[str, ...]  # the dotted names imported (`apex.amp`, `amp`)
    used: Tuple[bool, ...]


@dataclass(frozen=True)
class Usage:
    """What the rewritten module reads: its import statements in order, every name read anywhere, and the
    names bound at module level."""

    imports: Tuple[ImportUse, ...]
    read: Set[str]
    module_bound: Set[str]


def _statements(body: List[ast.stmt], chain: Chain) -> Iterator[Tuple[ast.stmt, Chain]]:
    for statement in body:
        yield statement, chain
        inner = chain + ((statement.name, statement.lineno),) if isinstance(
            statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else chain
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(statement, field, None) or [], inner)
        for part in [*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())]:
            yield from _statements(part.body, inner)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


Segment = Tuple[List[ast.stmt], int]  # a block and where in it the statements that run next start


def _reached(body: List[ast.stmt], after: Tuple[Segment, ...], defs: List[ast.stmt],
             nested: bool = False) -> Iterator[Tuple[ast.stmt, Optional[List[ast.stmt]]]]:
    """Each import with what runs after it in its scope (the rest of its block, then what follows each block
    around it; a loop's whole body; the scope's defs, whose bodies may run later) when it is nested in an
    `if`/`try`/loop, else None (Python's scopes alone decide); None for every other statement."""
    scope_defs = defs if nested else [statement for statement in body if isinstance(statement, _SCOPES)]
    for index, statement in enumerate(body):
        rest = ((body, index + 1),) + after
        if isinstance(statement, (ast.Import, ast.ImportFrom)) and nested:
            yield statement, [later for block, start in rest for later in block[start:]] + scope_defs
            continue
        yield statement, None
        if isinstance(statement, _SCOPES):
            yield from _reached(statement.body, (), [])
            continue
        loop = ((statement.body, 0),) if isinstance(statement, (ast.For, ast.AsyncFor, ast.While)) else ()
        for part in [getattr(statement, field, None) or [] for field in ("body", "orelse", "finalbody")] + [
                handler.body for handler in [*getattr(statement, "handlers", ()), *getattr(statement, "cases", ())]]:
            yield from _reached(part, loop + rest, scope_defs, nested=True)


def _names_in(statements: List[ast.stmt]) -> Set[str]:
    return {node.id for statement in statements for node in ast.walk(statement)
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store)}


def _names_read(tree: ast.Module) -> Tuple[Set[str], Set[str]]:
    """(every name read, the names in annotations, strings included), in one walk of the tree."""
    read: Set[str] = set()
    annotated: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Store):
                read.add(node.id)
            continue
        typed = [getattr(node, "annotation", None), getattr(node, "returns", None)]
        if isinstance(node, ast.Call) and _callee(node.func) in _TYPING_CALLS:  # cast("T", x), TypeVar(bound="T")
            typed += [*node.args, *(keyword.value for keyword in node.keywords)]
        for annotation in typed:
            if annotation is None:
                continue
            for part in ast.walk(annotation):
                if isinstance(part, ast.Name):
                    annotated.add(part.id)
                elif isinstance(part, ast.Constant) and isinstance(part.value, str):
                    annotated.update(_IDENTIFIER.findall(part.value))
    return read, annotated


def _callee(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def symbols_of(table: symtable.SymbolTable) -> List[symtable.Symbol]:
    """The table's symbols, without the scan of every nested scope that `get_symbols()` makes for each one
    (quadratic in a module's functions): read from the table's flags where this Python keeps them."""
    flags = getattr(getattr(table, "_table", None), "symbols", None)
    if not isinstance(flags, dict):
        return table.get_symbols()
    return [symtable.Symbol(name, flag) for name, flag in flags.items()]


def _table(top: symtable.SymbolTable, chain: Chain) -> Optional[symtable.SymbolTable]:
    table = top
    for name, line in chain:
        table = next((child for child in table.get_children()
                      if child.get_name() == name and child.get_lineno() == line), None)
        if table is None:
            return None
    return table


def _reads(table: symtable.SymbolTable, name: str, binding: bool = True) -> bool:
    """Whether `table` reads `name` (its own binding, or, not `binding`, one from an enclosing scope), or a
    scope nested in it that does not bind the name itself does."""
    try:
        symbol = table.lookup(name)
    except KeyError:
        symbol = None
    if symbol is not None:
        if not binding and (symbol.is_assigned() or symbol.is_imported() or symbol.is_parameter()
                            or symbol.is_declared_global()):
            return False
        if symbol.is_referenced():
            return True
    if binding and table.get_type() == "class":
        return False  # methods do not see a class body's names
    return any(_reads(child, name, binding=False) for child in table.get_children())


def usage_of(code: bytes) -> Optional[Usage]:
    """The Usage of `code` (None when Python cannot parse it)."""
    try:
        text = importlib.util.decode_source(code)
        tree = ast.parse(text)
        top = symtable.symtable(text, "<migrated>", "exec")
    except (SyntaxError, ValueError):
        return None
    read, annotated = _names_read(tree)
    reached = {id(statement): after for statement, after in _reached(tree.body, (), [])}
    imports = []
    for statement, chain in _statements(tree.body, ()):
        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue
        table = _table(top, chain)
        bound = [alias.asname or (alias.name.split(".")[0] if isinstance(statement, ast.Import) else alias.name)
                 for alias in statement.names]
        after = reached.get(id(statement))
        later = _names_in(after) if after is not None else None  # (an import in one branch, read in the other)
        used = tuple(name == "*" or table is None or name in annotated or _reads(table, name) and (
            later is None or name in later) for name in bound)
        imports.append(ImportUse(tuple(alias.name for alias in statement.names), used))
    bound = {symbol.get_name() for symbol in symbols_of(top) if symbol.is_imported() or symbol.is_assigned()}
    return Usage(tuple(imports), read | annotated, bound)
