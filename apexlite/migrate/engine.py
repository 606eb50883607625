"""The migration of one script, source bytes in, source bytes out.

1. parse and analyse (apexlite.migrate.analysis); 2. plan: the amp part (all or nothing), the
optimizer/parallel/normalization replacements, then a TODO for every apex use no planner took;
3. apply the plan; 4. the import pass on a fresh parse of the result; 5. the result must compile (else
the original is kept, with the reason) and is read by `check` (apexlite.check.scan) to say what of apex
is left. Bytes the plan does not touch come out exactly as they went in (libcst's round trip).
"""
from __future__ import annotations

import ast
import importlib.util
import pathlib
import symtable
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from apexlite import check
from apexlite.migrate import apis
from apexlite.migrate.amp_part import plan_amp
from apexlite.migrate.analysis import Analysis, parse
from apexlite.migrate.device import detect
from apexlite.migrate.edits import TODO_PREFIX, Applier, Plan, Todo, wrapped_comment
from apexlite.migrate.imports import ImportPlanner
from apexlite.migrate.initialize import KEEP, AmpSetup
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.replacements import plan_replacements


@dataclass
class MigrationResult:
    """What migrate made of one script."""

    original: bytes
    migrated: bytes
    todos: List[Todo] = field(default_factory=list)
    todo_lines: List[int] = field(default_factory=list)  # line of each TODO comment in `migrated`
    notes: List[str] = field(default_factory=list)
    setup: Optional[AmpSetup] = None
    remaining: List[Tuple[str, List[int], str]] = field(default_factory=list)  # check.scan of `migrated`
    error: Optional[str] = None  # the rewrite did not compile: `migrated` is the original

    @property
    def changed(self) -> bool:
        return self.migrated != self.original

    @property
    def needs_apexlite(self) -> bool:
        return self.setup is not None and self.setup.recipe == KEEP

    @property
    def exit_status(self) -> int:
        return 1 if self.todos or self.error else 0


def _plan_leftovers(plan: Plan) -> None:
    """Every apex use no planner took keeps its code and gets a TODO quoting `check`'s status for it."""
    for use in plan.analysis.uses:
        if plan.is_handled(use.node):
            continue
        name, status = apis.status(use.written)
        plan.todo(use.node, f"`{plan.analysis.code(use.node)}` has no certain torch rewrite ({name}: {status}); "
                            "see MIGRATION.md")


def _compiles(source: bytes) -> Optional[str]:
    try:
        compile(source, "<migrated>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _unbound_names(wrapper: MetadataWrapper) -> Set[str]:
    """Names the module reads without any binding before them (builtins are bound), in libcst's scopes."""
    names: Set[str] = set()
    for scope in set(wrapper.resolve(ScopeProvider).values()):
        if scope is None:
            continue
        names.update(access.node.value for access in scope.accesses
                     if not access.referents and isinstance(access.node, cst.Name))
    return names


def _symbols(source: bytes) -> Tuple[Set[str], Set[str]]:
    """(names read and bound nowhere, names imported at module level), from Python's symbol tables: order
    does not matter to them, which is all a check of the import pass needs (it only edits imports)."""
    top = symtable.symtable(importlib.util.decode_source(source), "<migrate>", "exec")
    tables, bound, read = [top], set(), set()
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if table is top or symbol.is_declared_global():
                if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
                    bound.add(name)
                if symbol.is_referenced():
                    read.add(name)
            elif symbol.is_global() and symbol.is_referenced():  # read in a function or class, bound nowhere in it
                read.add(name)
    imported = {symbol.get_name() for symbol in top.get_symbols() if symbol.is_imported()}
    return read - bound, imported


def _lost_names(unbound: Set[str], first_wrapper: MetadataWrapper, first: bytes, migrated: bytes) -> Set[str]:
    """Names the migrated script reads without defining them where the original (whose unbound names are
    `unbound`) defined them. The rewrite (source -> first) is checked in libcst's scopes, already computed
    for the import pass; the import pass (first -> migrated), which only edits imports, by the symbol
    tables, without another libcst parse."""
    if _compiles(first) is not None:  # the import pass repaired it: check the end result in libcst's scopes
        return _unbound_names(MetadataWrapper(cst.parse_module(migrated))) - unbound
    (unbound_first, imported_first), (unbound_migrated, imported_migrated) = _symbols(first), _symbols(migrated)
    added = imported_migrated - imported_first  # `import torch`, added by the import pass before any use
    return (_unbound_names(first_wrapper) - unbound - added) | (unbound_migrated - unbound_first)


def _todo_lines(code: bytes, todos: List[Todo]) -> List[int]:
    """The line of each TODO's comment in `code` (0 when it is not there: the original was kept)."""
    text = code.decode("utf-8", "replace").splitlines()
    used: set = set()
    found = []
    for todo in todos:
        wanted = wrapped_comment(TODO_PREFIX + todo.message)[0]
        line = next((number for number, content in enumerate(text, start=1)
                     if number not in used and content.strip() == wanted), 0)
        used.add(line)
        found.append(line)
    return found


def plan_migration(analysis: Analysis, options: MigrateOptions) -> Tuple[Plan, Optional[AmpSetup]]:
    """Every edit of the first pass, without applying any."""
    plan = Plan(analysis)
    device = detect(analysis)
    setup = plan_amp(plan, options, device)
    plan_replacements(plan, device)
    _plan_leftovers(plan)
    return plan, setup


def _mentions_apex(source: bytes) -> bool:
    """Whether any apex root can be named in `source`: an import of one needs its name in the text."""
    return any(root.encode() in source for root in apis.ROOTS)


def migrate_source(source: bytes, options: MigrateOptions = MigrateOptions()) -> MigrationResult:
    """Migrate one script's source (raises libcst.ParserSyntaxError when libcst cannot parse it)."""
    if not _mentions_apex(source):  # nothing to rewrite: the result is the source, without parsing it with libcst
        return MigrationResult(source, source, remaining=check.scan(ast.parse(source)))
    wrapper, analysis = parse(source)
    plan, setup = plan_migration(analysis, options)
    first = wrapper.visit(Applier(plan)).bytes
    todos, notes, needs_torch = sorted(plan.todos, key=lambda todo: todo.line), list(plan.notes), plan.needs_torch
    unbound = _unbound_names(wrapper)
    del wrapper, analysis, plan  # the first tree and its metadata go before the second parse: peak memory is one
    second_wrapper, second_analysis = parse(first)
    imports = ImportPlanner(second_analysis, keep_amp=setup is not None and setup.recipe == KEEP)
    migrated = second_wrapper.visit(Applier(imports.plan_all(needs_torch))).bytes
    result = MigrationResult(source, migrated, todos, notes=notes, setup=setup)
    source_compiles = _compiles(source) is None
    error = _compiles(migrated) if source_compiles else None
    if error is None and source_compiles and migrated != source:
        lost = _lost_names(unbound, second_wrapper, first, migrated)
        if lost:
            error = f"it would read {', '.join(sorted(lost))} without defining it (a migrate bug: please report it)"
    if error is not None:
        result.migrated, result.error = source, f"the rewritten script is not sound ({error}); nothing changed"
    result.todo_lines = _todo_lines(result.migrated, todos)
    result.remaining = check.scan(ast.parse(result.migrated))
    return result


def migrate_sources(sources: Mapping[pathlib.Path, bytes],
                    options: MigrateOptions = MigrateOptions()) -> Dict[pathlib.Path, MigrationResult]:
    """Migrate the files of one program (a repository) together; one result per path (raises
    libcst.ParserSyntaxError when libcst cannot parse one of them). Each file is migrated on its own here."""
    return {path: migrate_source(source, options) for path, source in sources.items()}
