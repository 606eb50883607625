"""An opt level that a flag switches between O0 and one other level: `"O1" if use_fp16 else "O0"`, written
in the call or assigned once to the name the call passes (Mask R-CNN's `amp_opt_level`).

O0 is plain fp32, so the script trains in mixed precision only when the flag holds: the migration is the
other level's, enabled by that flag, as `enabled=flag` would be. The reverse form (`"O0" if flag else "O1"`)
and anything else stay a run-time choice (a TODO, or --opt-level).

A level chosen at run time and migrated for another level by --opt-level still turns mixed precision off
when the run picks O0, as apex did: autocast and GradScaler get `enabled=<level> != "O0"`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from apexlite.amp.opt_levels import OPT_LEVELS
from apexlite.migrate import apis
from apexlite.migrate.analysis import Analysis
from apexlite.migrate.edits import Plan
from apexlite.migrate.guards import Condition, is_pure
from apexlite.migrate.values import NOT_LITERAL, literal


def o0_switch(analysis: Analysis, node: Optional[cst.BaseExpression]) -> Optional[Tuple[str, cst.BaseExpression]]:
    """(the other level, the flag) when `node` is `LEVEL if flag else "O0"` or a name bound once to it."""
    expression = _bound_value(analysis, node) if isinstance(node, cst.Name) else node
    if not isinstance(expression, cst.IfExp):
        return None
    level, otherwise = literal(analysis, expression.body), literal(analysis, expression.orelse)
    if otherwise == "O0" and isinstance(level, str) and level in OPT_LEVELS and level != "O0":
        return level, expression.test
    return None


def needs_o0_test(analysis: Analysis, node: Optional[cst.BaseExpression], migrated_level: str,
                  conditions: List[Condition]) -> bool:
    """Whether `node` is an opt level chosen at run time, migrated for a level other than O0, that no `if` around
    amp.initialize already tests (`if args.opt_level != "O0":`): a run choosing O0 must then turn amp off."""
    if node is None or migrated_level == "O0" or literal(analysis, node) is not NOT_LITERAL:
        return False
    code = analysis.code(node).strip()
    return not any(code in analysis.code(condition.test) for condition in conditions)


def runtime_o0_test(analysis: Analysis, node: Optional[cst.BaseExpression], migrated_level: str,
                    conditions: List[Condition]) -> Optional[cst.BaseExpression]:
    """`<node> != "O0"` where `needs_o0_test` and `node` can be evaluated again (is_pure), else None."""
    if not needs_o0_test(analysis, node, migrated_level, conditions) or not is_pure(node):
        return None
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Comparison(left=node, comparisons=[cst.ComparisonTarget(operator=cst.NotEqual(),
                                                                       comparator=cst.SimpleString('"O0"'))])


def gate_runtime_o0(plan: Plan, call: cst.Call, node: Optional[cst.BaseExpression], migrated_level: str,
                    conditions: List[Condition], flag: Optional[cst.BaseExpression]
                    ) -> Optional[Tuple[Optional[cst.BaseExpression], str]]:
    """(the `enabled` flag, what it reads: "" when unchanged) with `runtime_o0_test` joined to `flag`; None, with
    a TODO, for a run-time level migrate cannot evaluate again (a call: `os.environ.get(...)`)."""
    analysis = plan.analysis
    test = runtime_o0_test(analysis, node, migrated_level, conditions)
    if test is None and needs_o0_test(analysis, node, migrated_level, conditions):
        plan.todo(call, f"opt_level comes from `{analysis.code(node).strip()}` at run time, which migrate cannot "
                        "evaluate again to turn autocast and the GradScaler off when it is O0: assign it to a "
                        "variable before amp.initialize (`opt_level = ...`), pass that, and run migrate again")
        return None
    if test is None:
        return flag, ""
    return and_flags(flag, test), ("its enabled=, and " if flag is not None else "") + "O0 at run time is fp32"


def and_flags(first: Optional[cst.BaseExpression], second: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """`first and second`, either alone when the other is None."""
    if first is None or second is None:
        return first if second is None else second
    return cst.BooleanOperation(left=first, operator=cst.And(), right=second)


def may_run_o2(analysis: Analysis, level_given: Optional[str]) -> bool:
    """Whether an amp.initialize call of this file may run O2 (a literal O2, or a level chosen at run time
    that --opt-level does not fix to another): where its amp part stays unmigrated, apex's DDP must not become
    torch's, which would leave each rank the masters of its own weights."""
    for use in analysis.uses_of(apis.INITIALIZE):
        call = analysis.call_of(use)
        if call is None:
            return True
        keyword = [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "opt_level"]
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        node = keyword[0] if keyword else positional[2] if len(positional) > 2 else None
        if node is None:
            continue  # apex's default, O1
        value = literal(analysis, node)
        if value == "O2" or (value is NOT_LITERAL and level_given in (None, "O2")):
            return True
    return False


def _bound_value(analysis: Analysis, name: cst.Name) -> Optional[cst.BaseExpression]:
    """The value of `name = value`, the one binding `name` has where it is read; else None."""
    scope = analysis.scope(name)
    bindings = list(scope[name.value]) if scope is not None else []
    target = getattr(bindings[0], "node", None) if len(bindings) == 1 else None
    assign_target = analysis.parent(target) if target is not None else None
    assign = analysis.parent(assign_target) if assign_target is not None else None
    if isinstance(assign_target, cst.AssignTarget) and assign_target.target is target \
            and isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return assign.value
    return None
