"""Forwards of amp's models outside every autocast region (evaluation, inference): apex's O1/O2 ran them in low
precision, the migrated script runs them in float32. Each gets a comment saying how to keep low precision; one
whose input the script casts to half precision itself (SSD's `img = img.half()` under --amp) would now fail, so it
is a TODO."""
from __future__ import annotations

import builtins
from typing import Any, List

import libcst as cst

from apexlite.migrate.analysis import Analysis
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.reach import Unit


def plan_outside_forwards(unit: Unit, setup: AmpSetup, outside: List[cst.Call]) -> None:
    """A comment (or TODO) at each forward in `outside`, and one note for the report."""
    flag = f", enabled={setup.enabled}" if setup.enabled else ""
    header = f"torch.autocast(device_type={setup.device_expr}, dtype=torch.{setup.dtype}{flag})"
    for call in outside:
        missing = _undefined_at(unit.analysis, call, header)
        passing = (f" ({', '.join(f'`{name}`' for name in missing)} {'is' if len(missing) == 1 else 'are'} not "
                   f"defined here: pass {'it' if len(missing) == 1 else 'them'} in)") if missing else ""
        halved = _half_inputs(unit.analysis, call)
        if halved:
            unit.plan.todo(call, f"`{unit.analysis.code(call.func)}(...)` here gets input the script casts to "
                                 f"half precision ({', '.join(f'`{code}`' for code in halved)}), which apex's "
                                 f"{setup.level} casts took; the migrated model stays float32 outside "
                                 f"torch.autocast and refuses it: run it under `with {header}:`{passing}, or "
                                 "drop the cast")
            continue
        unit.plan.comment(call, f"`{unit.analysis.code(call.func)}(...)` here runs in float32 now (apex's "
                                f"{setup.level} ran every forward in low precision); for that, run it under `with "
                                f"{header}:`{passing}")
    if outside:
        lines = ", ".join(str(unit.analysis.line(call)) for call in outside)
        unit.plan.notes.append(f"{len(outside)} forward pass(es) outside the training step (line {lines}: "
                               f"evaluation, say) run in float32 now, where apex's {setup.level} ran them in low "
                               "precision: a comment there says how to keep that")


def _undefined_at(analysis: Any, node: cst.CSTNode, code: str) -> List[str]:
    """The names `code` reads (besides builtins) that no scope visible at `node` defines."""
    scope = analysis.scope(node)
    expression = cst.parse_expression(code)
    keywords = {id(arg.keyword) for arg in analysis.walk(expression, cst.Arg) if arg.keyword is not None}
    attributes = {id(attr.attr) for attr in analysis.walk(expression, cst.Attribute)}
    names = dict.fromkeys(name.value for name in analysis.walk(expression, cst.Name)
                          if id(name) not in keywords and id(name) not in attributes)
    return [name for name in names if name not in vars(builtins) and scope is not None and name not in scope]


HALF_CASTS = ("half", "bfloat16")


def _half_inputs(analysis: Analysis, call: cst.Call) -> List[str]:
    """The statements of the function around `call` that cast a name it reads to half precision
    (`img = img.half()`: SSD's evaluation input under --amp)."""
    scope = analysis.enclosing_scope_owner(call) or analysis.module
    read = analysis.loaded_names(call)
    found = []
    for assign in analysis.walk(scope, cst.Assign):
        targets = {target.target.value for target in assign.targets if isinstance(target.target, cst.Name)}
        value = assign.value
        if targets & read and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and (
                value.func.attr.value in HALF_CASTS or value.func.attr.value == "to" and "float16" in
                analysis.code(value)) and analysis.position(assign) < analysis.position(call):
            found.append(analysis.code(assign).strip())
    return found
