"""How files migrated together import from each other: which file a `from X import ...` names, every such
import by the name it binds, and the optimizer a file imports from the one that calls amp.initialize (the
GradScaler is then imported beside it)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import libcst as cst

from apexlite.migrate.analysis import Analysis, dotted_text
from apexlite.migrate.programs import ModuleIndex

Key = Path


@dataclass
class ImportTie:
    """`from <home module> import optimizer` in another file: the GradScaler is imported beside it."""

    key: Key
    statement: cst.ImportFrom
    optimizers: Dict[str, int]  # bound name -> optimizer index


Resolver = Callable[[Key, cst.ImportFrom], Optional[Key]]


def module_resolver(paths: Sequence[Key]) -> Resolver:
    """Which of `paths` a `from X import ...` in one of them names (apexlite.migrate.programs.ModuleIndex:
    relative imports by the importer's folder, absolute ones by the dotted path's ending, the nearest root
    above the importer when several fit); None when no file, or more than one, fits."""
    index = ModuleIndex(paths)

    def resolve(importer: Key, node: cst.ImportFrom) -> Optional[Key]:
        module = dotted_text(node.module) if node.module is not None else None
        if module is None:
            return None
        return index.resolve(importer, module, len(node.relative))

    return resolve


ImportIndex = Dict[Tuple[Key, str], List[Tuple[Key, cst.ImportFrom, str]]]


def import_index(analyses: Dict[Key, Analysis], resolve: Resolver) -> ImportIndex:
    """(file imported from, name) -> every (importing file, `from ... import` statement, bound name)."""
    index: ImportIndex = {}
    for key, analysis in analyses.items():
        for node in import_froms(analysis.module):
            if isinstance(node.names, cst.ImportStar):
                continue
            source = resolve(key, node)
            if source is None:
                continue
            for alias in node.names:
                name = dotted_text(alias.name) or ""
                bound = alias.asname.name.value if alias.asname is not None else name
                index.setdefault((source, name), []).append((key, node, bound))
    return index


def import_froms(module: cst.Module):
    """Every `from ... import` statement, found through statements only (imports are never inside an
    expression), which is far cheaper than visiting every node."""
    stack: List[cst.CSTNode] = list(reversed(module.body))
    while stack:
        statement = stack.pop()
        if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield from (small for small in statement.body if isinstance(small, cst.ImportFrom))
            continue
        suites = [getattr(statement, "body", None), *(getattr(statement, "handlers", ()) or ()),
                  *(getattr(statement, "cases", ()) or ()), getattr(statement, "orelse", None),
                  getattr(statement, "finalbody", None)]
        for suite in reversed(suites):
            if isinstance(suite, (cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)):
                suite = suite.body
            if isinstance(suite, (cst.If, cst.SimpleStatementSuite)):
                stack.append(suite)
            elif isinstance(suite, cst.IndentedBlock):
                stack.extend(reversed(suite.body))


def import_tie(analysis: Analysis, key: Key, home: Key, home_owner: cst.CSTNode, optimizer_targets,
                index: ImportIndex) -> Optional[ImportTie]:
    """`from <home> import optimizer` at the top level of `analysis`, when amp.initialize runs at module level."""
    if not isinstance(home_owner, cst.Module):
        return None
    found: Dict[cst.ImportFrom, Dict[str, int]] = {}
    for position, target in enumerate(optimizer_targets):
        for importer, node, bound in index.get((home, dotted_text(target) or ""), ()):
            if importer == key and analysis.enclosing_scope_owner(node) is None:
                found.setdefault(node, {})[bound] = position
    if not found:
        return None
    node, names = next(iter(found.items()))
    return ImportTie(key, node, names)
