"""The migration of one script, or of files together, source bytes in, source bytes out.

0. (files together) group them into programs by their imports (apexlite.migrate.programs); then per
program: 1. parse and analyse (apexlite.migrate.analysis); 2. plan: the amp part (all or nothing, across
the files one amp.initialize reaches: apexlite.migrate.reach), the optimizer/parallel/normalization
replacements, then the leftovers (apexlite.migrate.leftovers); 3. apply the plan; 4. the import pass,
from what the result reads (apexlite.migrate.usage), applied with the plan; 5. the result must compile,
read no name it does not define, and leave no name undefined on a path where the original defined it
(apexlite.migrate.soundness): else the amp part goes back to the user as a TODO, or the original is
kept, with the reason; 6. `check` (apexlite.check.scan) says what of apex is left. Bytes the plan does
not touch come out exactly as they went in (libcst's round trip; comments inside replaced code are kept:
apexlite.migrate.kept_comments).
"""
from __future__ import annotations

import ast
import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper

from apexlite import check
from apexlite.migrate import apis
from apexlite.migrate.amp_part import is_amp, plan_amp_files
from apexlite.migrate.analysis import Analysis, dotted_text, parse
from apexlite.migrate.applier import Applier
from apexlite.migrate.device import CPU, CUDA, RUNTIME, detect
from apexlite.migrate.edits import TODO_PREFIX, Plan, Todo, wrapped_comment
from apexlite.migrate.imports import ImportPlanner, with_imports
from apexlite.migrate.level_switch import may_run_o2
from apexlite.migrate.leftovers import plan_leftovers
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.recipes import KEEP
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.programs import FileFacts, ImportGraph, mentions_apex, python_tree, read_facts
from apexlite.migrate.import_ties import Resolver, module_resolver
from apexlite.migrate.replacements import plan_replacements
from apexlite.migrate.rewrite_check import Applied, soundness_error
from apexlite.migrate.usage import usage_of

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
    unreadable: bool = False  # libcst could not read the file (`error` says why): nothing was attempted

    @property
    def changed(self) -> bool:
        return self.migrated != self.original

    @property
    def needs_apexlite(self) -> bool:
        return self.setup is not None and self.setup.recipe == KEEP

    @property
    def exit_status(self) -> int:
        return 1 if self.todos or self.error else 0


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector paused while one file or program is migrated: libcst builds hundreds of
    thousands of live nodes, and each full collection walks them all, which made the cost grow faster
    than the file (a 20,000-line script: 24 CPU s with it, 18 without, the same peak memory). The
    objects are collected as usual once it runs again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _todo_lines(code: bytes, todos: List[Todo]) -> List[int]:
    """The line of each TODO's comment in `code` (0 when it is not there: the original was kept); TODOs
    with the same first line take those lines in order."""
    lines: Dict[str, List[int]] = {}
    for number, content in enumerate(code.decode("utf-8", "replace").splitlines(), start=1):
        if content.lstrip().startswith(TODO_PREFIX):
            lines.setdefault(content.strip(), []).append(number)
    for numbers in lines.values():
        numbers.reverse()
    found = []
    for todo in todos:
        numbers = lines.get(wrapped_comment(TODO_PREFIX + todo.message)[0])
        found.append(numbers.pop() if numbers else 0)
    return found


@dataclass
class _Group:
    """Files migrated jointly: the one with amp.initialize (`home`) and the files it may reach."""

    keys: List[Path]
    home: Optional[Path]
    elsewhere: str = ""  # where amp.initialize is called in the programs of these files, when that is ambiguous


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
        analysis = parsed[key][1]
        keep_amp = (setup is not None and setup.recipe == KEEP) or _imports_apexlite_amp(analysis)
        plans[key].keeps_apex_ddp = keep_amp or (setup is None and may_run_o2(analysis, options.opt_level))
        plan_replacements(plans[key], detect(analysis), keep_amp=plans[key].keeps_apex_ddp)
        plan_leftovers(plans[key])
    return plans, setup


def _imports_apexlite_amp(analysis: Analysis) -> bool:
    """The file already runs O2 on apexlite's amp (an earlier migration kept it): `from apexlite import amp`."""
    return any(isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None
               and dotted_text(node.module) == "apexlite" and not isinstance(node.names, cst.ImportStar)
               and any(dotted_text(alias.name) == "amp" for alias in node.names)
               for node in analysis.nodes(cst.ImportFrom))


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


def _apply(wrapper: MetadataWrapper, plan: Plan, setup: Optional[AmpSetup]) -> Applied:
    """The plan applied, then again with the import edits its result calls for (one more pass over the
    original tree: its import statements are the first result's)."""
    first = wrapper.visit(Applier(plan)).bytes if plan.has_edits else wrapper.module.bytes
    usage = usage_of(first)
    if usage is None:  # the rewrite does not compile: the soundness check refuses it, imports or not
        return Applied(first, first)
    imports = ImportPlanner(plan.analysis, setup is not None and setup.recipe == KEEP, usage,
                            keep_ddp=plan.keeps_apex_ddp).plan_all(plan.needs_torch)
    if not imports.has_edits:
        return Applied(first, first)
    return Applied(first, wrapper.visit(Applier(with_imports(plan, imports))).bytes)


def _refusal(names: List[str], where: str) -> str:
    shown = ", ".join(f"`{name}`" for name in names)
    return (f"migrate's rewrite of amp would read {shown}{where} on a path that does not define it (amp.initialize "
            "runs inside a `try`, loop or branch that other paths skip, or after that use): create the GradScaler and the device "
            "where every path that uses them runs, with `enabled=` saying when amp is on, or keep apexlite's "
            "amp (`from apexlite import amp`)")


def _migrate_group(parsed, sources: Mapping[Path, bytes], group: _Group, options: MigrateOptions,
                   resolve: Resolver) -> Dict[Path, MigrationResult]:
    """Plan, apply and check a group; the amp part goes back to the user (a TODO) when its rewrite would
    leave a name undefined on some path, and any other failure keeps that file's original."""
    plans, setup = _plan(parsed, group, options, None, resolve)
    migrated = {key: _apply(parsed[key][0], plans[key], setup) for key in group.keys}
    checks = {key: soundness_error(sources[key], migrated[key]) for key in group.keys}
    unsound = [(key, names) for key, (_, names) in checks.items() if names]
    if unsound and setup is not None:
        key, names = unsound[0]
        where = f" (in {_shown(group.keys)(key)})" if len(group.keys) > 1 and key != group.home else ""
        first_plans = plans
        plans, setup = _plan(parsed, group, options, _refusal(names, where), resolve)
        for key in group.keys:  # a file amp did not change comes out as before: no need to apply it again
            if first_plans[key].merged_edits or plans[key].todos != first_plans[key].todos:
                migrated[key] = _apply(parsed[key][0], plans[key], setup)
                checks[key] = soundness_error(sources[key], migrated[key])
    return {key: _result(sources[key], migrated[key].migrated, plans[key],
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


def _untouched(source: bytes, tree: Optional[ast.Module] = None) -> Optional[MigrationResult]:
    """The result for a source migrate has nothing to do with (no apex named, valid Python), without a
    libcst parse: the full pipeline would give the same (nothing to rewrite, nothing left for `check`
    beyond what it finds here)."""
    tree = python_tree(source) if tree is None else tree
    if tree is None:
        return None  # the full pipeline says why
    return MigrationResult(source, source, remaining=check.scan(tree))


def _unreadable(source: bytes, why: str) -> MigrationResult:
    return MigrationResult(source, source, error=why, unreadable=True)


def migrate_source(source: bytes, options: MigrateOptions = MigrateOptions()) -> MigrationResult:
    """Migrate one script's source (raises libcst.ParserSyntaxError when libcst cannot parse it).

    The rewrite must compile, read no name it does not define, and leave no name undefined on a path
    where the original defined it. When the amp part breaks the last rule it is left to the user (a TODO
    at amp.initialize) and the rest is migrated; any other failure keeps the original, with the reason."""
    if not mentions_apex(source):
        untouched = _untouched(source)
        if untouched is not None:
            return untouched
    key = Path("<script>")
    with _cyclic_gc_paused():
        parsed = {key: parse(source)}
        group = _Group([key], key if parsed[key][1].uses_of(apis.INITIALIZE) else None)
        return _migrate_group(parsed, {key: source}, group, options, lambda importer, node: None)[key]


def migrate_sources(sources: Mapping[Path, bytes],
                    options: MigrateOptions = MigrateOptions()) -> Dict[Path, MigrationResult]:
    """Migrate files jointly (a repository), program by program (apexlite.migrate.programs): where
    amp.initialize is in one file and its optimizers are used in others of its program (a `train()` called
    with them, `from train import optimizer`), the GradScaler is made beside amp.initialize and reaches them
    the way the optimizer does; where it cannot, each file's amp part stays, with TODOs naming the other
    file and line. Only the files a migration can change are parsed with libcst, one group at a time, so
    memory follows the largest group, not the repository. A file libcst cannot read keeps its bytes, with
    the reason as its error and `unreadable` set."""
    facts: Dict[Path, Optional[FileFacts]] = {}
    results: Dict[Path, MigrationResult] = {}
    for key, source in sources.items():  # one Python parse per file, dropped at once
        tree = python_tree(source)
        facts[key] = read_facts(source, tree) if tree is not None else None
        if tree is not None and not facts[key].apex:
            results[key] = _untouched(source, tree)
    broken = [key for key, found in facts.items() if found is None]
    graph = ImportGraph({key: found for key, found in facts.items() if found is not None})
    shown = _shown(list(sources))
    groups = [_Group(group.keys, group.home, ", ".join(f"{shown(key)}:{line}" for key, line in group.initialize_calls))
              for group in graph.groups()] + [_Group([key], None) for key in broken]
    del facts, graph
    for group in groups:
        with _cyclic_gc_paused():
            results.update(_migrate_parsed_group(sources, group, options))
    for key, source in sources.items():
        if key not in results:
            results[key] = _untouched(source) or MigrationResult(source, source)
    return {key: results[key] for key in sources}


def _migrate_parsed_group(sources: Mapping[Path, bytes], group: _Group,
                          options: MigrateOptions) -> Dict[Path, MigrationResult]:
    """Parse a group's files with libcst and migrate them; a file libcst cannot read is left out, unreadable."""
    results: Dict[Path, MigrationResult] = {}
    parsed: Dict[Path, Tuple[MetadataWrapper, Analysis]] = {}
    for key in group.keys:
        try:
            parsed[key] = parse(sources[key])
        except cst.ParserSyntaxError as error:
            results[key] = _unreadable(sources[key], f"libcst cannot parse it: {error.message} (line {error.raw_line})")
        except RecursionError:
            results[key] = _unreadable(sources[key], "it is nested too deeply to rewrite")
    group.keys = [key for key in group.keys if key in parsed]
    if group.home not in parsed:
        group.home = None
    try:
        results.update(_migrate_group(parsed, sources, group, options, module_resolver(list(parsed))))
    except RecursionError:
        results.update({key: _unreadable(sources[key], "it is nested too deeply to rewrite") for key in group.keys})
    return results


def _flag_order(item: Tuple[str, str]) -> int:
    return ("--opt-level", "--loss-scale").index(item[0]) if item[0] in ("--opt-level", "--loss-scale") else 2
