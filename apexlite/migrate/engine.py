"""The migration of one script, source bytes in, source bytes out.

1. parse and analyse (apexlite.migrate.analysis); 2. plan: the amp part (all or nothing), the
optimizer/parallel/normalization replacements, then a TODO for every apex use no planner took;
3. apply the plan; 4. the import pass on a fresh parse of the result; 5. the result must compile (else
the original is kept, with the reason) and is read by `check` (apexlite.check.scan) to say what of apex
is left. Bytes the plan does not touch come out exactly as they went in (libcst's round trip).
"""
from __future__ import annotations

import ast
import pathlib
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


def _unbound_names(wrapper) -> Set[str]:
    """Names the module reads without any binding (builtins are bound)."""
    names: Set[str] = set()
    for scope in set(wrapper.resolve(ScopeProvider).values()):
        if scope is None:
            continue
        names.update(access.node.value for access in scope.accesses
                     if not access.referents and isinstance(access.node, cst.Name))
    return names


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
    second_wrapper, second_analysis = parse(first)
    imports = ImportPlanner(second_analysis, keep_amp=setup is not None and setup.recipe == KEEP)
    migrated = second_wrapper.visit(Applier(imports.plan_all(plan.needs_torch))).bytes
    todos = sorted(plan.todos, key=lambda todo: todo.line)
    result = MigrationResult(source, migrated, todos, notes=list(plan.notes), setup=setup)
    error = _compiles(migrated) if _compiles(source) is None else None
    if error is None and migrated != source:
        lost = _unbound_names(MetadataWrapper(cst.parse_module(migrated))) - _unbound_names(wrapper)
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
