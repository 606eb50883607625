"""What `migrate` tells the user: the recipe, each TODO with its line in the migrated script, the notes, and
what `check` still finds of apex in the result."""
from __future__ import annotations

from typing import List

from apexlite.migrate.engine import MigrationResult
from apexlite.migrate.initialize import AUTOCAST, HALF, KEEP, NONE


RECIPES = {AUTOCAST: "torch.autocast({dtype})", HALF: "the model in {dtype}", NONE: "fp32", KEEP: "amp kept from apexlite"}


def _recipe(result: MigrationResult) -> str:
    setup = result.setup
    if setup is None:
        return ""
    what = RECIPES[setup.recipe].format(dtype=setup.dtype)
    scaler = " + torch.amp.GradScaler" if setup.scaled else ""
    return f"opt_level {setup.level}: {what}{scaler}"


def _places(count: int) -> str:
    return f"{count} place{'' if count == 1 else 's'} left for you"


def format_report(result: MigrationResult, script: str, shown_as: str, todo_lines_in_original: bool = False) -> str:
    """The report as text, one item a line. `shown_as`: where the migrated script went (the script itself
    for --in-place and --diff); `todo_lines_in_original`: give TODO places by the script's own lines (--diff)."""
    lines: List[str] = []
    head = script if shown_as == script else f"{script} -> {shown_as}"
    recipe = _recipe(result)
    if result.error:
        lines.append(f"apexlite migrate: {script}: {result.error}")
    elif not result.changed and not result.todos:
        lines.append(f"apexlite migrate: {script}: nothing to migrate")
    elif result.todos:
        details = "; ".join(filter(None, ["marked TODO(apexlite migrate)", recipe]))
        lines.append(f"apexlite migrate: {head}: {_places(len(result.todos))} ({details})")
    else:
        lines.append(f"apexlite migrate: {head}: migrated completely" + (f" ({recipe})" if recipe else ""))
    for todo, line in zip(result.todos, result.todo_lines):
        where = f"{shown_as}:{line}" if line and not todo_lines_in_original else f"{script}:{todo.line}"
        lines.append(f"  TODO {where}: {todo.message}")
    if result.flags:
        lines.append(f"  run migrate again with {' '.join(result.flags)} (or the values you train with) for the "
                     "choices the script makes at run time")
    for note in result.notes:
        lines.append(f"  note: {note}")
    if result.needs_apexlite:
        lines.append("  note: the migrated script imports apexlite (O2's amp), so it needs apexlite installed")
    if result.remaining:
        left = ", ".join(f"{api} (line {','.join(map(str, api_lines))})" for api, api_lines, _ in result.remaining)
        lines.append(f"check: the migrated script still uses {left}")
    else:
        lines.append("check: no apex APIs used")
    return "\n".join(lines) + "\n"
