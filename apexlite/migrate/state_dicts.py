"""amp's state in checkpoints and prints: `amp.state_dict()`, `amp.load_state_dict(...)`,
`amp._amp_state.loss_scalers[k].loss_scale()`.

The checkpoint keeps its key: `{"amp": amp.state_dict()}` becomes `{"amp": scaler.state_dict()}` (one
scaler), or a dict in apex's own layout `{"loss_scaler0": ..., "loss_scaler1": ...}` with each loss id's
GradScaler state (several); loading reads either form, apex's `{'loss_scale', 'unskipped'}` (a checkpoint
written before the migration) into GradScaler's scale and growth tracker; without a scaler amp's state is
empty (`{}`) and loading it goes. A loss
scale read for a print becomes `scaler.get_scale()` (1.0 without a scaler). Anything else amp kept in
`_amp_state` has no native counterpart: a TODO.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import ApexUse, dotted_text
from apexlite.migrate.edits import Plan, expression, small_statement
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.reach import Unit
from apexlite.migrate.scale_loss import ScaleLossPlanner
from apexlite.migrate.values import literal

CHECKPOINT_NOTE = ("checkpoints written before the migration hold apex's scaler state ({'loss_scaler0': "
                   "{'loss_scale', 'unskipped'}}): such a state is read into GradScaler's form here (its scale "
                   "and growth tracker), one written since is loaded as it is")


def _scaler_names(planner: ScaleLossPlanner) -> Dict[int, str]:
    return {loss_id: scaler.name for loss_id, scaler in sorted(planner.scaler_of_loss.items())}


def _state_dict_code(planner: ScaleLossPlanner) -> str:
    names = _scaler_names(planner)
    if not names:
        return "{}"
    if len(planner.scalers) == 1 and list(names) == [0]:
        return f"{names[0]}.state_dict()"
    return "{" + ", ".join(f'"loss_scaler{loss_id}": {name}.state_dict()' for loss_id, name in names.items()) + "}"


def _plan_save(plan: Plan, planner: ScaleLossPlanner, use: ApexUse) -> None:
    call = plan.analysis.call_of(use)
    if call is None or call.args:
        plan.todo(use.node, "amp.state_dict is used other than as amp.state_dict(); save the GradScaler's "
                            "state_dict() instead")
        return
    code = _state_dict_code(planner)
    plan.replace_expression(call, lambda _: expression(code))


def _plan_load(plan: Plan, planner: ScaleLossPlanner, use: ApexUse) -> None:
    analysis = plan.analysis
    call = analysis.call_of(use)
    small = analysis.small_statement_of(use.node)
    if call is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star \
            or not (isinstance(small, cst.Expr) and small.value is call):
        plan.todo(use.node, "amp.load_state_dict is used other than as a statement amp.load_state_dict(state); "
                            "load the GradScaler's state with scaler.load_state_dict(state)")
        return
    names = _scaler_names(planner)
    state = call.args[0].value
    if not names:
        plan.comment(call, "amp.load_state_dict(...) removed: nothing is loss-scaled any more")
        plan.replace_small(small, lambda _: [])
        return
    if not _repeatable(state):
        plan.todo(call, "load each GradScaler from this state, which a checkpoint written before the migration "
                        "holds in apex's form (assign the state to a variable first, and run migrate again)")
        return
    plan.comment(call, CHECKPOINT_NOTE)
    state_code = analysis.code(state)
    if len(planner.scalers) == 1 and list(names) == [0]:
        apex_state = state_code + '["loss_scaler0"]'
        lines = [f"{names[0]}.load_state_dict({_either_form(state_code, apex_state, names[0])})"]
    else:
        lines = [f'{name}.load_state_dict({_either_form(key, key, name)})' for name, key in
                 ((name, f'{state_code}["loss_scaler{loss_id}"]') for loss_id, name in names.items())]
    plan.replace_small(small, lambda _: [small_statement(line) for line in lines])


def _either_form(state: str, apex_state: str, scaler: str) -> str:
    """`state` when it is a GradScaler's, else `apex_state` (apex's {'loss_scale', 'unskipped'}) in its form."""
    return (f'{state} if "scale" in {state} else {{**{scaler}.state_dict(), "scale": {apex_state}["loss_scale"], '
            f'"_growth_tracker": {apex_state}["unskipped"]}}')


def _repeatable(node: cst.BaseExpression) -> bool:
    """Whether evaluating `node` twice is as good as once (names, attributes, literal subscripts)."""
    if dotted_text(node) is not None:
        return True
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return _repeatable(node.value) and isinstance(node.slice[0].slice.value, (cst.SimpleString, cst.Integer))
    return False


def _loss_scale_call(plan: Plan, node: cst.CSTNode) -> Optional[cst.Call]:
    """`node.loss_scale()` when that is what encloses `node`."""
    analysis = plan.analysis
    attribute = analysis.parent(node)
    call = analysis.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    if isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value == "loss_scale" \
            and isinstance(call, cst.Call) and call.func is attribute and not call.args:
        return call
    return None


def _plan_loss_scalers(plan: Plan, planner: ScaleLossPlanner, setup: AmpSetup, use: ApexUse) -> bool:
    analysis = plan.analysis
    names = _scaler_names(planner)
    scaled = bool(planner.scalers)
    parent = analysis.parent(use.node)
    if isinstance(parent, cst.Subscript) and parent.value is use.node and len(parent.slice) == 1 \
            and isinstance(parent.slice[0].slice, cst.Index):
        loss_id = literal(analysis, parent.slice[0].slice.value)
        call = _loss_scale_call(plan, parent)
        if call is None or not isinstance(loss_id, int) or (scaled and loss_id not in names):
            return False
        if scaled:
            plan.replace_expression(call, lambda _: expression(f"{names[loss_id]}.get_scale()"))
        else:
            _constant_scale(plan, call)
        return True
    comp_for = parent
    comprehension = analysis.parent(comp_for) if isinstance(comp_for, cst.CompFor) else None
    if not (isinstance(comp_for, cst.CompFor) and comp_for.iter is use.node and comp_for.inner_for_in is None
            and isinstance(comprehension, (cst.ListComp, cst.GeneratorExp, cst.SetComp))
            and isinstance(comp_for.target, cst.Name) and not comp_for.ifs):
        return False
    element = comprehension.elt
    if not (isinstance(element, cst.Call) and _loss_scale_call(plan, element.func.value) is element
            and isinstance(element.func.value, cst.Name) and element.func.value.value == comp_for.target.value):
        return False
    if scaled:
        if sorted(names) != list(range(setup.num_losses)):
            return False
        listed = [names[i] for i in range(setup.num_losses)]
        scalers = f"({listed[0]},)" if len(listed) == 1 else "(" + ", ".join(listed) + ")"
        plan.replace_expression(use.node, lambda _: expression(scalers))
        plan.replace_expression(element.func, lambda updated: updated.with_changes(attr=cst.Name("get_scale")))
    else:
        plan.replace_expression(use.node, lambda _: expression(f"range({setup.num_losses})"))
        plan.replace_expression(element, lambda _: expression("1.0"))
    return True


def _constant_scale(plan: Plan, call: cst.Call) -> None:
    """Nothing is scaled: the scale is 1.0, written into an f-string's text rather than as `{1.0}`."""
    holder = plan.analysis.parent(call)
    if isinstance(holder, cst.FormattedStringExpression) and holder.expression is call \
            and holder.conversion is None and holder.format_spec is None and holder.equal is None:
        plan.replace_expression(holder, lambda _: cst.FormattedStringText("1.0"))
    else:
        plan.replace_expression(call, lambda _: expression("1.0"))


def plan_state(unit: Unit, setup: AmpSetup, planner: ScaleLossPlanner) -> None:
    plan, analysis = unit.plan, unit.analysis
    state_uses: List[ApexUse] = [use for use in analysis.uses if use.api != apis.MASTER_PARAMS and (
        use.api in (apis.STATE_DICT, apis.LOAD_STATE_DICT) or use.api == apis.AMP_STATE
        or use.api.startswith(apis.AMP_STATE + "."))]
    for use in state_uses:
        plan.handle(use.node)
        if planner.scalers and not unit.ties.reaches_scaler(use.node):
            plan.todo(use.node, f"`{analysis.code(use.node)}` becomes the GradScaler's ({planner.scalers[0].name}), "
                                "which cannot be read here: pass it in (a parameter) and run migrate again")
        elif use.api == apis.STATE_DICT:
            _plan_save(plan, planner, use)
        elif use.api == apis.LOAD_STATE_DICT:
            _plan_load(plan, planner, use)
        elif not (use.api == apis.LOSS_SCALERS and _plan_loss_scalers(plan, planner, setup, use)):
            plan.todo(use.node, f"`{analysis.code(use.node)}` is amp's internal state; read the GradScaler instead "
                                "(scaler.get_scale() is the loss scale)")
