"""What `migrate` tells the user: for one file, the recipe, each TODO with its line in the migrated script,
the notes, and what `check` still finds of apex in the result; for several, one table (a row per file:
migrated / TODOs / not rewritten / unchanged / refused), the TODOs by file and line, and the totals."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from apexlite.migrate.engine import MigrationResult
from apexlite.migrate.recipes import AUTOCAST, HALF, KEEP, NONE
from apexlite.wording import counted


RECIPES = {AUTOCAST: "torch.autocast({dtype})", HALF: "the model in {dtype}", NONE: "fp32", KEEP: "amp kept from apexlite"}


def kept_reason(result: MigrationResult) -> str:
    """Why a file kept amp (imported from apexlite) instead of moving to native torch.amp."""
    return f"amp stays, imported from apexlite, which the script now needs installed: {result.setup.kept_reason}"


def recipe(result: MigrationResult) -> str:
    """`opt_level O1: torch.autocast(float16) + torch.amp.GradScaler`, or "" without amp."""
    setup = result.setup
    if setup is None:
        return ""
    what = RECIPES[setup.recipe].format(dtype=setup.dtype)
    scaler = " + torch.amp.GradScaler" if setup.scaler_names else ""
    return f"opt_level {setup.level}: {what}{scaler}"


def _places(count: int) -> str:
    return f"{counted(count, 'place')} left for you"


def format_report(result: MigrationResult, script: str, shown_as: str,
                  locate: Optional[Callable[[int, bool], str]] = None, todo_lines_in_original: bool = False) -> str:
    """The report as text, one item a line. `shown_as`: where the migrated script went (the script itself
    for --in-place and --diff); `locate(line, in_migrated)` names a line in a notebook's cells;
    `todo_lines_in_original`: give TODO places by the script's own lines (--diff)."""
    lines: List[str] = []
    head = script if shown_as == script else f"{script} -> {shown_as}"
    how = recipe(result)
    if result.error:
        lines.append(f"apexlite migrate: {script}: {result.error}")
    elif not result.changed and not result.todos:
        lines.append(f"apexlite migrate: {script}: nothing to migrate")
    elif result.todos:
        details = "; ".join(filter(None, ["marked TODO(apexlite migrate)", how]))
        lines.append(f"apexlite migrate: {head}: {_places(len(result.todos))} ({details})")
    elif result.needs_apexlite:
        lines.append(f"apexlite migrate: {head}: kept on apexlite, not migrated to native torch.amp ({how})")
        lines.append(f"  why: {kept_reason(result)}")
    else:
        lines.append(f"apexlite migrate: {head}: migrated completely" + (f" ({how})" if how else ""))
    for todo, line in zip(result.todos, result.todo_lines):
        in_migrated = bool(line) and not todo_lines_in_original
        if locate is not None:
            where = f"{shown_as} {locate(line, True)}" if in_migrated else f"{script} {locate(todo.line, False)}"
        else:
            where = f"{shown_as}:{line}" if in_migrated else f"{script}:{todo.line}"
        lines.append(f"  TODO {where}: {todo.message}")
    if result.flags:
        lines.append(f"  run migrate again with {' '.join(result.flags)} (or the values you train with) for the "
                     "choices the script makes at run time")
    for note in result.notes:
        lines.append(f"  note: {note}")
    if result.needs_apexlite and result.todos:
        lines.append("  note: the migrated script imports apexlite (O2's amp), so it needs apexlite installed")
    lines.append(_check_line(result, locate))
    return "\n".join(lines) + "\n"


def _check_line(result: MigrationResult, locate: Optional[Callable[[int, bool], str]]) -> str:
    if not result.remaining:
        return "check: no apex APIs used"
    if locate is None:
        left = ", ".join(f"{api} (line {','.join(map(str, api_lines))})" for api, api_lines, _ in result.remaining)
    else:
        left = ", ".join(f"{api} ({', '.join(locate(line, True) for line in api_lines)})"
                         for api, api_lines, _ in result.remaining)
    return f"check: the migrated script still uses {left}"


def format_table(rows: Sequence[Sequence[str]], headers: Sequence[str]) -> List[str]:
    """Left-aligned columns, two spaces apart, the last one unpadded."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers) - 1)]
    return ["  " + "  ".join([*(f"{cell:{width}}" for cell, width in zip(row, widths)), str(row[-1])]).rstrip()
            for row in [headers, *rows]]
