"""The report of a `migrate` run over several files: one row per file (its outcome, its TODOs, where it
was written), every TODO by file and line, what the walk skipped, and the totals. Files that keep amp on
apexlite (O2) are a row kind and a total of their own, with the reason, never counted as migrated."""
from __future__ import annotations

from typing import Dict, List, Optional

from apexlite.migrate.files import KEPT, MIGRATED, NOT_REWRITTEN, REFUSED, TODOS, UNCHANGED, FileMigration
from apexlite.migrate.report import format_table, kept_reason, recipe
from apexlite.script_paths import Collection, skipped_summary
from apexlite.wording import counted

OUTCOMES = (MIGRATED, KEPT, TODOS, NOT_REWRITTEN, UNCHANGED, REFUSED)
WRITE_FAILED = "write failed"


def _detail(item: FileMigration, written: Optional[str]) -> str:
    if item.write_error is not None:
        return item.write_error
    if item.refusal is not None:
        return item.refusal
    if item.error is not None:
        return item.error
    detail = recipe(item.result).strip(" ()") if item.result.setup is not None else ""
    if written is not None and written != item.path:
        detail = f"-> {written}" + (f"; {detail}" if detail else "")
    return detail


def _todo_lines(item: FileMigration, written: Optional[str]) -> List[str]:
    """Each TODO where it is: at its line in the written file (the TODO comment), else at the original's."""
    if item.result is None or item.error is not None and not item.result.todos:
        return []
    out = []
    for todo, line in zip(item.result.todos, item.result.todo_lines):
        if line and written is not None:
            out.append(f"  TODO {written} {item.location(line, True)}: {todo.message}")
        else:
            out.append(f"  TODO {item.path} {item.location(todo.line, False)}: {todo.message}")
    return out


def _rerun_line(files: List[FileMigration]) -> List[str]:
    """The options a second run needs for what the files choose at run time, named once for all of them."""
    flags: List[str] = []
    for item in files:
        for flag in item.result.flags if item.result is not None else ():
            if flag not in flags:
                flags.append(flag)
    if not flags:
        return []
    return [f"run migrate again with {' '.join(flags)} (or the values you train with) for the choices the scripts "
            "make at run time"]


def totals(files: List[FileMigration]) -> str:
    """`7 files: 2 migrated, 1 with TODOs (3 TODOs), ...` (outcomes with no file left out)."""
    counts: Dict[str, int] = {outcome: 0 for outcome in (*OUTCOMES, WRITE_FAILED)}
    for item in files:
        counts[WRITE_FAILED if item.write_error is not None else item.outcome] += 1
    todos = sum(len(item.result.todos) for item in files if item.result is not None)
    parts = []
    for outcome, count in counts.items():
        if count:
            parts.append(f"{count} with TODOs ({counted(todos, 'TODO')})" if outcome == TODOS else f"{count} {outcome}")
    return f"{counted(len(files), 'file')}: " + (", ".join(parts) if parts else "none found")


def format_summary(files: List[FileMigration], found: Collection, written: Dict[str, str], how: str) -> str:
    """The whole report; `written` maps a file's path to where its output went, `how` says what was written."""
    lines = [f"apexlite migrate: {totals(files)}"]
    if files:
        rows = []
        for item in files:
            outcome = WRITE_FAILED if item.write_error is not None else item.outcome
            count = str(len(item.result.todos)) if item.result is not None else "-"
            rows.append([item.path, outcome, count, _detail(item, written.get(item.path))])
        lines += format_table(rows, ["file", "result", "TODOs", "details"])
    for item in files:
        lines += _todo_lines(item, written.get(item.path))
    lines += _rerun_line(files)
    kept: Dict[str, List[str]] = {}  # why -> the files kept on apexlite for it
    for item in files:
        if item.write_error is None and item.outcome == KEPT:
            kept.setdefault(kept_reason(item.result), []).append(item.path)
    for why, paths in kept.items():
        lines.append(f"  kept on apexlite ({', '.join(paths)}): {why}")
    for item in files:
        if item.result is not None:
            lines += [f"  note {item.path}: {note}" for note in item.result.notes]
            if item.result.needs_apexlite and item.outcome != KEPT:
                lines.append(f"  note {item.path}: it imports apexlite (O2's amp), so it needs apexlite installed")
    skipped = skipped_summary(found)
    if skipped:
        lines.append(skipped)
    lines.append(how)
    return "\n".join(lines) + "\n"
