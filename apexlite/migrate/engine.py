"""The migration of one script, or of files together, source bytes in, source bytes out.

1. parse and analyse (apexlite.migrate.analysis); 2. plan: the amp part (all or nothing, across the
files one amp.initialize reaches: apexlite.migrate.reach), the optimizer/parallel/normalization
replacements, then the leftovers (apexlite.migrate.leftovers); 3. apply the plan; 4. the import pass on
a fresh parse of the result; 5. the result must compile, read no name it does not define, and leave no
name undefined on a path where the original defined it (apexlite.migrate.soundness): else the amp part
goes back to the user as a TODO, or the original is kept, with the reason; 6. `check`
(apexlite.check.scan) says what of apex is left. Bytes the plan does not touch come out exactly as they
went in (libcst's round trip).
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from apexlite import check
from apexlite.migrate import apis
from apexlite.migrate.amp_part import is_amp, plan_amp_files
from apexlite.migrate.analysis import Analysis, parse
from apexlite.migrate.device import CPU, CUDA, RUNTIME, detect
from apexlite.migrate.edits import TODO_PREFIX, Applier, Plan, Todo, wrapped_comment
from apexlite.migrate.imports import ImportPlanner
from apexlite.migrate.leftovers import plan_leftovers
from apexlite.migrate.initialize import KEEP, AmpSetup
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.reach import Resolver, module_resolver
from apexlite.migrate.replacements import plan_replacements
from apexlite.migrate.soundness import undefined_reads


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
    flags: List[str] = field(default_factory=list)  # options a rerun needs for run-time choices ("--opt-level O1")

    @property
    def changed(self) -> bool:
        return self.migrated != self.original

    @property
    def needs_apexlite(self) -> bool:
        return self.setup is not None and self.setup.recipe == KEEP

    @property
    def exit_status(self) -> int:
        return 1 if self.todos or self.error else 0


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


@dataclass
class _Group:
    """Files migrated jointly: the one with amp.initialize (`home`) and the files it may reach."""

    keys: List[Path]
    home: Optional[Path]
    elsewhere: str = ""  # where amp.initialize is called in other files, when that is ambiguous


def _groups(parsed: Dict[Path, Tuple[MetadataWrapper, Analysis]]) -> List[_Group]:
    """One group for all files when exactly one calls amp.initialize (once); else each file alone."""
    calls = [(key, use.line) for key, (_, analysis) in parsed.items() for use in analysis.uses_of(apis.INITIALIZE)]
    if len(calls) == 1:
        return [_Group(list(parsed), calls[0][0])]
    shown = _shown(list(parsed))
    elsewhere = ", ".join(f"{shown(key)}:{line}" for key, line in calls)
    homes = {key for key, _ in calls}
    return [_Group([key], key if key in homes else None, "" if key in homes else elsewhere) for key in parsed]


def _device(analyses: List[Analysis]) -> str:
    """The device of amp's files together: the run-time choice if any file makes one, else CUDA if any
    names it, else the CPU."""
    kinds = {detect(analysis) for analysis in analyses}
    return RUNTIME if RUNTIME in kinds else CUDA if CUDA in kinds else CPU


def _plan(parsed, group: _Group, options: MigrateOptions, refused_amp: Optional[str],
          resolve: Resolver) -> Tuple[Dict[Path, Plan], Optional[AmpSetup]]:
    """Every edit of the first pass of each file of the group, without applying any."""
    plans = {key: Plan(parsed[key][1]) for key in group.keys}
    involved = [parsed[key][1] for key in group.keys if key == group.home or any(
        is_amp(use) for use in parsed[key][1].uses)]
    setup = plan_amp_files(plans, group.home, options, _device(involved), refused_amp, resolve,
                           _shown(group.keys), group.elsewhere)
    for key in group.keys:
        plan_replacements(plans[key], detect(parsed[key][1]))
        plan_leftovers(plans[key])
    return plans, setup


def _shown(keys: List[Path]):
    """Files named in messages relative to the folder they share (`pkg/train.py`)."""
    if len(keys) < 2:
        return str
    root = Path(os.path.commonpath([str(key.parent) for key in keys]))

    def shown(key: Path) -> str:
        try:
            return str(key.relative_to(root))
        except ValueError:
            return str(key)

    return shown


def _apply(wrapper: MetadataWrapper, plan: Plan, setup: Optional[AmpSetup]) -> bytes:
    first = wrapper.visit(Applier(plan)).bytes
    second_wrapper, second_analysis = parse(first)
    imports = ImportPlanner(second_analysis, keep_amp=setup is not None and setup.recipe == KEEP)
    return second_wrapper.visit(Applier(imports.plan_all(plan.needs_torch))).bytes


def _soundness_error(wrapper: MetadataWrapper, source: bytes, migrated: bytes) -> Tuple[Optional[str], List[str]]:
    """(why the rewrite must not be used, names some path would read undefined that the original defined)."""
    if migrated == source:
        return None, []
    error = _compiles(migrated) if _compiles(source) is None else None
    if error is not None:
        return error, []
    lost = _unbound_names(MetadataWrapper(cst.parse_module(migrated))) - _unbound_names(wrapper)
    if lost:
        return f"it would read {', '.join(sorted(lost))} without defining it (a migrate bug: please report it)", []
    before = undefined_reads(source)
    partial = sorted({name for (scope, name) in undefined_reads(migrated) if (scope, name) not in before})
    if partial:
        return f"it would read {', '.join(partial)} where some path leaves it undefined", partial
    return None, []


def _refusal(names: List[str], where: str) -> str:
    shown = ", ".join(f"`{name}`" for name in names)
    return (f"migrate's rewrite of amp would read {shown}{where} on a path that does not define it (amp.initialize "
            "runs inside a `try`, loop or branch that other paths skip): create the GradScaler and the device "
            "where every path that uses them runs, with `enabled=` saying when amp is on, or keep apexlite's "
            "amp (`from apexlite import amp`)")


def _migrate_group(parsed, sources: Mapping[Path, bytes], group: _Group, options: MigrateOptions,
                   resolve: Resolver) -> Dict[Path, MigrationResult]:
    """Plan, apply and check a group; the amp part goes back to the user (a TODO) when its rewrite would
    leave a name undefined on some path, and any other failure keeps that file's original."""
    plans, setup = _plan(parsed, group, options, None, resolve)
    migrated = {key: _apply(parsed[key][0], plans[key], setup) for key in group.keys}
    checks = {key: _soundness_error(parsed[key][0], sources[key], migrated[key]) for key in group.keys}
    unsound = [(key, names) for key, (_, names) in checks.items() if names]
    if unsound and setup is not None:
        key, names = unsound[0]
        where = f" (in {_shown(group.keys)(key)})" if len(group.keys) > 1 and key != group.home else ""
        first_plans = plans
        plans, setup = _plan(parsed, group, options, _refusal(names, where), resolve)
        for key in group.keys:  # a file amp did not change comes out as before: no need to apply it again
            if first_plans[key].merged_edits or plans[key].todos != first_plans[key].todos:
                migrated[key] = _apply(parsed[key][0], plans[key], setup)
                checks[key] = _soundness_error(parsed[key][0], sources[key], migrated[key])
    return {key: _result(sources[key], migrated[key], plans[key],
                         setup if any(is_amp(use) for use in parsed[key][1].uses) else None, checks[key][0])
            for key in group.keys}


def _result(source: bytes, migrated: bytes, plan: Plan, setup: Optional[AmpSetup],
            error: Optional[str]) -> MigrationResult:
    todos = sorted(plan.todos, key=lambda todo: todo.line)
    result = MigrationResult(source, migrated, todos, notes=list(plan.notes), setup=setup,
                             flags=[f"{flag} {value}" for flag, value in sorted(plan.flags.items(), key=_flag_order)])
    if error is not None:
        result.migrated, result.error = source, f"the rewritten script is not sound ({error}); nothing changed"
    result.todo_lines = _todo_lines(result.migrated, todos)
    result.remaining = check.scan(ast.parse(result.migrated))
    return result


def migrate_source(source: bytes, options: MigrateOptions = MigrateOptions()) -> MigrationResult:
    """Migrate one script's source (raises libcst.ParserSyntaxError when libcst cannot parse it).

    The rewrite must compile, read no name it does not define, and leave no name undefined on a path
    where the original defined it. When the amp part breaks the last rule it is left to the user (a TODO
    at amp.initialize) and the rest is migrated; any other failure keeps the original, with the reason."""
    key = Path("<script>")
    parsed = {key: parse(source)}
    return _migrate_group(parsed, {key: source}, _Group([key], key if parsed[key][1].uses_of(apis.INITIALIZE)
                                                        else None), options, lambda importer, node: None)[key]


def migrate_sources(sources: Mapping[Path, bytes],
                    options: MigrateOptions = MigrateOptions()) -> Dict[Path, MigrationResult]:
    """Migrate files jointly (a repository): where amp.initialize is in one file and its optimizers are
    used in others (a `train()` called with them, `from train import optimizer`), the GradScaler is made
    beside amp.initialize and reaches them the way the optimizer does; where it cannot, each file's amp
    part stays, with TODOs naming the other file and line. A file libcst cannot parse keeps its bytes,
    with the reason as its error."""
    parsed: Dict[Path, Tuple[MetadataWrapper, Analysis]] = {}
    results: Dict[Path, MigrationResult] = {}
    for key, source in sources.items():
        try:
            parsed[key] = parse(source)
        except cst.ParserSyntaxError as error:
            results[key] = MigrationResult(source, source, error=f"libcst cannot parse it: {error.message} "
                                                                  f"(line {error.raw_line}); nothing changed")
        except RecursionError:
            results[key] = MigrationResult(source, source, error="it is nested too deeply to rewrite; nothing changed")
    resolve = module_resolver(list(parsed))
    for group in _groups(parsed):
        try:
            results.update(_migrate_group(parsed, sources, group, options, resolve))
        except RecursionError:
            results.update({key: MigrationResult(sources[key], sources[key], error="it is nested too deeply to "
                                                 "rewrite; nothing changed") for key in group.keys})
    return {key: results[key] for key in sources}


def _flag_order(item: Tuple[str, str]) -> int:
    return ("--opt-level", "--loss-scale").index(item[0]) if item[0] in ("--opt-level", "--loss-scale") else 2
