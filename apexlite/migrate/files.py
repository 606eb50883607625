"""The files of one `migrate` run: each read as a program (a script, or a notebook's code cells), all
migrated together (engine.migrate_sources, so one file's amp setup can be seen from another), and each
given the bytes to write back (a notebook is rebuilt around its new cells) and an outcome for the report.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from typing import List, Optional

from apexlite import check
from apexlite.migrate.engine import MigrationResult, migrate_sources
from apexlite.migrate.options import MigrateOptions
from apexlite.notebook import NotebookError
from apexlite.script_paths import Target
from apexlite.script_program import Program, load_program
from apexlite.script_source import ScriptSourceError


MIGRATED, TODOS, NOT_REWRITTEN, UNCHANGED, REFUSED = "migrated", "TODOs", "not rewritten", "unchanged", "refused"
KEPT = "kept on apexlite"  # complete, but amp stays (O2), imported from apexlite: not native torch.amp
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
        if self.result.needs_apexlite:
            return KEPT
        return MIGRATED if self.changed else UNCHANGED

    @property
    def exit_status(self) -> int:
        """0 complete (native, or kept on apexlite) or nothing to do, 1 TODOs left or rewrite refused, 2 not
        read (see cli.EXIT_STATUSES)."""
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


def migrate_all(files: List[FileMigration], options: MigrateOptions) -> None:
    """Migrate every file that was read, together; fill in results, outputs and refusals (a file libcst
    cannot read is refused with one line, as a file Python cannot read is)."""
    readable = [item for item in files if item.program is not None]
    sources = {pathlib.Path(item.target.real): item.program.source for item in readable}
    results = migrate_sources(sources, options)
    for item in readable:
        outcome = results[pathlib.Path(item.target.real)]
        if outcome.unreadable:
            item.refusal, item.program = f"{item.path}: {outcome.error}; nothing written", None
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
