"""The files of one `migrate` run: each read as a program (a script, or a notebook's code cells), all
migrated together (engine.migrate_sources, so one file's amp setup can be seen from another), and each
given the bytes to write back (a notebook is rebuilt around its new cells) and an outcome for the report.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import libcst as cst

from apexlite import check
from apexlite._logging import get_logger
from apexlite.migrate.engine import MigrationResult, migrate_sources
from apexlite.migrate.options import MigrateOptions
from apexlite.notebook import NotebookError
from apexlite.script_paths import Target
from apexlite.script_program import Program, load_program
from apexlite.script_source import ScriptSourceError

log = get_logger("migrate")

MIGRATED, TODOS, NOT_REWRITTEN, UNCHANGED, REFUSED = "migrated", "TODOs", "not rewritten", "unchanged", "refused"
BAD_INPUT_STATUS = 2


@dataclass
class FileMigration:
    """One file: what was read, what migrate made of it, what to write, and what went wrong."""

    target: Target
    program: Optional[Program] = None
    result: Optional[MigrationResult] = None
    output: Optional[bytes] = None  # the file's new content (the original where nothing changes)
    refusal: Optional[str] = None  # why it was not read or not migrated at all (one line)
    write_error: Optional[str] = None

    @property
    def path(self) -> str:
        return self.target.path

    @property
    def changed(self) -> bool:
        return self.program is not None and self.output is not None and self.output != self.program.data

    @property
    def error(self) -> Optional[str]:
        """Why the rewrite was refused (the engine's soundness check, or a notebook it could not rebuild)."""
        return self.result.error if self.result is not None else None

    @property
    def outcome(self) -> str:
        if self.refusal is not None:
            return REFUSED
        if self.error is not None:
            return NOT_REWRITTEN
        if self.result.todos:
            return TODOS
        return MIGRATED if self.changed else UNCHANGED

    @property
    def exit_status(self) -> int:
        """0 complete or nothing to do, 1 TODOs left or rewrite refused, 2 not read (see cli.EXIT_STATUSES)."""
        if self.refusal is not None:
            return BAD_INPUT_STATUS
        return 1 if self.error is not None or self.result.todos else 0

    def location(self, line: int, migrated: bool) -> str:
        """Where a line of the original (`migrated=False`) or migrated program is, as the user reads the file."""
        source = self.result.migrated if migrated else self.program.source
        return self.program.location(line, source)


def load(target: Target) -> FileMigration:
    """The file read as a program, or refused with one line."""
    try:
        return FileMigration(target, program=load_program(target.path))
    except ScriptSourceError as error:
        return FileMigration(target, refusal=str(error))


def _migrate_each(sources: Mapping[pathlib.Path, bytes], options: MigrateOptions
                  ) -> Dict[pathlib.Path, object]:
    """Every file on its own: a result, or the exception its parse raised."""
    results: Dict[pathlib.Path, object] = {}
    for path, source in sources.items():
        try:
            results[path] = migrate_sources({path: source}, options)[path]
        except (cst.ParserSyntaxError, RecursionError) as error:
            results[path] = error
    return results


def _refusal(path: str, error: BaseException) -> str:
    if isinstance(error, cst.ParserSyntaxError):
        return f"libcst cannot parse {path}: {error.message} (line {error.raw_line}); nothing written"
    return f"{path} is nested too deeply to rewrite; nothing written"


def migrate_all(files: List[FileMigration], options: MigrateOptions) -> None:
    """Migrate every file that was read, together; fill in results, outputs and refusals."""
    readable = [item for item in files if item.program is not None]
    sources = {pathlib.Path(item.target.real): item.program.source for item in readable}
    try:
        results: Dict[pathlib.Path, object] = dict(migrate_sources(sources, options))
    except (cst.ParserSyntaxError, RecursionError) as error:  # find the file(s): each on its own
        log.info("migrating the files together failed (%s); migrating each on its own", error)
        results = _migrate_each(sources, options)
    for item in readable:
        outcome = results[pathlib.Path(item.target.real)]
        if isinstance(outcome, BaseException):
            item.refusal, item.program = _refusal(item.path, outcome), None
            continue
        item.result = outcome
        item.output = _output(item)


def _output(item: FileMigration) -> bytes:
    program, result = item.program, item.result
    if program.notebook is None:
        return result.migrated
    for index, magic in program.notebook.kept_cells_naming_apex():
        result.notes.append(f"cell {index + 1} ({magic}) is not Python the kernel runs, so it is kept as it is; "
                            "migrate what it writes or runs on its own")
    if not result.changed:
        return program.data
    try:
        return program.notebook.rebuilt(result.migrated)
    except NotebookError as error:  # refused as the engine refuses an unsound rewrite: the original is kept
        result.migrated, result.error = result.original, str(error)
        result.todo_lines = [0] * len(result.todos)
        result.remaining = check.scan(ast.parse(result.original))
        return program.data
