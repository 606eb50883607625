"""`if fp16_run:` around amp: the conditions under which a statement runs, as code migrate can repeat.

NVIDIA's own training scripts call `amp.initialize` only under a flag and keep a plain fp32 path:
`if hparams.fp16_run: model, optimizer = amp.initialize(...)` ... `if hparams.fp16_run: with
amp.scale_loss(...) ... else: loss.backward()`. Its exact native form creates the GradScaler on every
path with `enabled=<the flag>` and gives autocast the same `enabled=`; a disabled GradScaler passes the
loss through, steps the optimizer plainly and never skips. That needs the flag to be an expression
migrate can evaluate again later with the same value: names, attributes, literal subscripts,
comparisons, `not`/`and`/`or`, never rebound after the `if` in its scope. This module reads the
conditions (`Guard`) and says why a guard cannot be repeated.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider

from apexlite.migrate.analysis import Analysis, base_name, dotted_text
from apexlite.migrate.edits import Plan
from apexlite.migrate.values import argparse_action

_SCOPE_OWNERS = (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Module)
_BLOCKING = {cst.For: "for", cst.While: "while", cst.Try: "try", cst.With: "with", cst.Match: "match"}
_LITERALS = (cst.SimpleString, cst.Integer, cst.Float, cst.ConcatenatedString)
_CONSTANT_NAMES = ("True", "False", "None")


@dataclass(frozen=True)
class Condition:
    """`test` is true (positive) or false where the statement runs; `owner` is the `if` that tests it."""

    test: cst.BaseExpression
    positive: bool
    owner: cst.If

    def key(self, analysis: Analysis) -> Tuple[str, bool]:
        return key(analysis, self.test, self.positive)


def key(analysis: Analysis, test: cst.BaseExpression, positive: bool) -> Tuple[str, bool]:
    """What two tests compare by: their code without spaces or outer parentheses, and the branch taken
    (`else` of `if not fp16:` is `fp16` holding)."""
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, positive = test.expression, not positive
    return re.sub(r"\s+", "", analysis.code(test)).strip("()"), positive


@dataclass
class Guard:
    """The `if` conditions, outermost first, between a statement and its function (or module)."""

    conditions: List[Condition] = field(default_factory=list)
    blocking: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)  # for/while/try/with/match in the guard

    @property
    def outermost(self) -> Optional[cst.If]:
        return self.conditions[0].owner if self.conditions else None


def read_guard(analysis: Analysis, node: cst.CSTNode) -> Guard:
    """The conditions under which `node` runs, from the `if`s (and `elif`/`else`) around it. A script's
    `if __name__ == "__main__":` is no condition: it holds whenever the script trains."""
    chain: List[cst.CSTNode] = [node]
    for ancestor in analysis.ancestors(node):
        if isinstance(ancestor, _SCOPE_OWNERS):
            break
        chain.append(ancestor)
    guard = Guard()
    pending: List[Tuple[cst.CSTNode, str]] = []
    for child, parent in zip(chain, chain[1:]):
        if isinstance(parent, cst.If) and child is parent.body and _is_main_guard(parent.test):
            continue
        if isinstance(parent, cst.If) and child is not parent.test:
            guard.conditions.append(Condition(parent.test, child is parent.body, parent))
            guard.blocking.extend(pending)
            pending = []
        elif isinstance(parent, tuple(_BLOCKING)) and not isinstance(child, (cst.WithItem, cst.BaseExpression)):
            pending.append((parent, _BLOCKING[type(parent)]))
    guard.conditions.reverse()
    return guard


def _is_main_guard(test: cst.BaseExpression) -> bool:
    return isinstance(test, cst.Comparison) and dotted_text(test.left) == "__name__" and len(test.comparisons) == 1 \
        and isinstance(test.comparisons[0].operator, cst.Equal) \
        and isinstance(test.comparisons[0].comparator, cst.SimpleString) \
        and test.comparisons[0].comparator.evaluated_value == "__main__"


def is_pure(node: cst.BaseExpression) -> bool:
    """Whether evaluating `node` again gives the same value with no side effect (given no rebinding)."""
    if isinstance(node, cst.Name) or isinstance(node, _LITERALS):
        return True
    if isinstance(node, cst.Attribute):
        return is_pure(node.value)
    if isinstance(node, cst.Subscript):
        return is_pure(node.value) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) \
            and isinstance(node.slice[0].slice.value, _LITERALS)
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, (cst.Not, cst.Minus)) and is_pure(node.expression)
    if isinstance(node, cst.BooleanOperation):
        return is_pure(node.left) and is_pure(node.right)
    if isinstance(node, cst.Comparison):
        return is_pure(node.left) and all(is_pure(target.comparator) for target in node.comparisons)
    if isinstance(node, cst.IfExp):
        return is_pure(node.test) and is_pure(node.body) and is_pure(node.orelse)
    if isinstance(node, cst.FormattedString):
        return all(not isinstance(part, cst.FormattedStringExpression) or is_pure(part.expression)
                   for part in node.parts)
    return False


def _chains(node: cst.CSTNode) -> List[cst.BaseExpression]:
    """The outermost name/attribute/subscript chains `node` reads (`hparams.fp16_run`, `cfg["amp"]`)."""
    if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
        return [] if isinstance(node, cst.Name) and node.value in _CONSTANT_NAMES else [node]
    return [chain for child in node.children for chain in _chains(child)]


def _is_boolean(analysis: Analysis, node: cst.BaseExpression) -> bool:
    """Whether `node` is certainly a bool (torch.autocast takes nothing else)."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return True
    if isinstance(node, cst.Comparison) or (isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not)):
        return True
    if isinstance(node, cst.BooleanOperation):
        return _is_boolean(analysis, node.left) and _is_boolean(analysis, node.right)
    if isinstance(node, cst.Name):
        return _bound_to_booleans(analysis, node)
    text = dotted_text(node)
    if text is not None and "." in text:
        return argparse_action(analysis, text.rsplit(".", 1)[1]) in ("store_true", "store_false")
    return False


def _bound_to_booleans(analysis: Analysis, name: cst.Name) -> bool:
    """Whether every binding of `name` is `name = True` / `name = False` (the HAS_APEX pattern)."""
    scope = analysis.scope(name)
    assignments = list(scope[name.value]) if scope is not None else []
    for assignment in assignments:
        target = getattr(assignment, "node", None)
        holder = analysis.parent(target) if target is not None else None
        statement = analysis.parent(holder) if isinstance(holder, cst.AssignTarget) else None
        if not (isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Name)
                and statement.value.value in ("True", "False")):
            return False
    return bool(assignments)


def _as_bool(analysis: Analysis, node: cst.BaseExpression, alone: bool) -> str:
    code = analysis.code(node).strip()
    if not _is_boolean(analysis, node):
        return f"bool({code})"
    return code if alone or node.lpar or not isinstance(node, cst.BooleanOperation) else f"({code})"


def enabled_code(analysis: Analysis, conditions: List[Condition], extra: Optional[cst.BaseExpression]) -> Optional[str]:
    """`enabled=` for autocast and GradScaler: true exactly where every condition (and `extra`) holds;
    a bool, as torch.autocast requires (`bool(flag)` unless the flag is certainly one)."""
    tests = [(condition.test, condition.positive) for condition in conditions]
    tests += [(extra, True)] if extra is not None else []
    alone = len(tests) == 1
    parts = []
    for test, positive in tests:
        if positive:
            parts.append(_as_bool(analysis, test, alone))
        else:
            code = analysis.code(test).strip()
            bare = not test.lpar and isinstance(test, (cst.BooleanOperation, cst.Comparison))
            parts.append(f"not ({code})" if bare else f"not {code}")
    return " and ".join(parts) if parts else None


def unstable(analysis: Analysis, tests: List[cst.BaseExpression], start: cst.CSTNode) -> Optional[str]:
    """Why `tests` might not keep, after `start`, the value they had there (a later assignment in the same
    function to a name or attribute they read), or None."""
    owner = analysis.enclosing_scope_owner(start)
    position = analysis.position(start)
    chains = [chain for test in tests for chain in _chains(test)]
    for chain in chains:
        name = base_name(chain)
        scope = analysis.scope(name) if name is not None else None
        for assignment in (scope[name.value] if scope is not None else ()):
            bound = getattr(assignment, "node", None)
            if bound is None or isinstance(bound, cst.Param):
                continue
            if analysis.enclosing_scope_owner(bound) is owner and analysis.position(bound) > position:
                return f"`{name.value}` is assigned again at line {analysis.line(bound)}"
    texts = {_text(analysis, chain) for chain in chains}
    for target in analysis.nodes((cst.Attribute, cst.Subscript)):
        if analysis.get_metadata(ExpressionContextProvider, target, None) not in (ExpressionContext.STORE,
                                                                                ExpressionContext.DEL):
            continue
        text = _text(analysis, target)
        if any(chain == text or chain.startswith(text + ".") or chain.startswith(text + "[") for chain in texts) \
                and analysis.enclosing_scope_owner(target) is owner and analysis.position(target) > position:
            return f"`{text}` is assigned at line {analysis.line(target)}"
    return None


def _text(analysis: Analysis, node: cst.CSTNode) -> str:
    return re.sub(r"\s+", "", analysis.code(node))


def resolves_alike(analysis: Analysis, tests: List[cst.BaseExpression], place: cst.CSTNode) -> bool:
    """Whether every name `tests` read means at `place` what it means where they are."""
    place_scope = analysis.scope(place)
    for chain in (chain for test in tests for chain in _chains(test)):
        name = base_name(chain)
        here = analysis.scope(name) if name is not None else None
        if here is None or place_scope is None:
            return False
        if {id(a) for a in here[name.value]} != {id(a) for a in place_scope[name.value]}:
            return False
    return True


def mentions(analysis: Analysis, node: cst.CSTNode, chains: List[str]) -> bool:
    """Whether `node` reads or binds one of the dotted `chains` (or an attribute of one)."""
    used = analysis.dotted_uses(node)
    return any(text == chain or text.startswith(chain + ".") for text in used for chain in chains)


def branch_calls_backward(analysis: Analysis, condition: Condition,
                          ignore: Callable[[cst.Call], bool] = lambda call: False) -> bool:
    """Whether the other branch of `condition`'s `if` calls `.backward(...)` (a call `ignore` accepts aside)."""
    other = condition.owner.orelse if condition.positive else condition.owner.body
    if other is None:
        return False
    return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" and not ignore(call)
               for call in analysis.walk(other, cst.Call))


# --- TODOs for guards migrate cannot repeat -----------------------------------------------------------
def check_guard(plan: Plan, guard: Guard, call: cst.Call, small: cst.BaseSmallStatement,
                 enabled_node: Optional[cst.BaseExpression]) -> None:
    """TODOs for an `if` around amp.initialize (or an `enabled=` flag) migrate cannot repeat exactly."""
    analysis = plan.analysis
    tests = [condition.test for condition in guard.conditions]
    shown = " and ".join(f"{'' if c.positive else 'not '}{analysis.code(c.test).strip()}" for c in guard.conditions)
    for test in tests + ([enabled_node] if enabled_node is not None else []):
        apex_names = [use for use in analysis.uses if any(node is use.node for node in _chains(test))]
        if apex_names:
            for use in apex_names:
                plan.handle(use.node)
            plan.todo(call, f"amp.initialize runs only when `{analysis.code(test).strip()}`, a test of apex itself, "
                            "which the migrated script no longer imports: test your own flag (e.g. --fp16) instead "
                            "and run migrate again")
            return
    for test in tests:
        if not is_pure(test):
            plan.todo(call, f"amp.initialize runs only when `{analysis.code(test).strip()}`, which migrate cannot "
                            "evaluate again for the GradScaler and torch.autocast (it calls or computes something): "
                            "assign it to a variable before the `if`, test that, and run migrate again")
            return
    if enabled_node is not None and not is_pure(enabled_node):
        plan.todo(call, "enabled= is an expression migrate cannot evaluate again: assign it to a variable so "
                        "autocast and GradScaler can take it too, and run migrate again")
        return
    for _, keyword in guard.blocking:
        plan.todo(call, f"amp.initialize runs inside a `{keyword}` within `if {shown}`: the GradScaler must exist "
                        f"on every path, so move amp.initialize out of the `{keyword}` (directly under the `if`) and "
                        "run migrate again")
        return
    start = guard.outermost or small
    why = unstable(analysis, tests + ([enabled_node] if enabled_node is not None else []), start)
    if why is not None:
        flag = f"`{shown}`" if guard.conditions else f"`enabled={analysis.code(enabled_node).strip()}`"
        plan.todo(call, f"amp.initialize runs only when {flag}, but {why}, so the GradScaler and torch.autocast "
                        "cannot be given the flag's value from there: assign it once to a new variable before the "
                        "`if` (`use_amp = ...`), use that, and run migrate again")


def model_touched_before(analysis: Analysis, guard: Guard, call: cst.Call, models: List[str]) -> bool:
    """Whether the outermost `if` around amp.initialize uses one of its models before the call."""
    statement = analysis.statement_of(call)
    chains = [text for text in models if text]
    for candidate in analysis.walk(guard.outermost.body, cst.BaseStatement):
        if candidate is statement or analysis.position(candidate) >= analysis.position(statement):
            continue
        if isinstance(candidate, cst.SimpleStatementLine) and mentions(analysis, candidate, chains):
            return True
    return False
