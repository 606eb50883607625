"""The optimizer steps of a scaled migration: each `optimizer.step()` of a scaled optimizer becomes
`scaler.step(optimizer)` then `scaler.update()`, every one or none (TODOs say why).

A GradScaler shared by several optimizers (loss ids whose gradients meet) is updated once, after the
last of their steps, which must then sit in one block. The steps are found in every file of the
migration, wherever the optimizer is reached (apexlite.migrate.reach).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import libcst as cst

from apexlite.migrate.analysis import dotted_text
from apexlite.migrate.edits import small_statement

if TYPE_CHECKING:
    from apexlite.migrate.reach import Unit
    from apexlite.migrate.scale_loss import ScaleLossPlanner, Scaler, Site

PATCHED_OPTIMIZER_METHODS = ("step", "zero_grad")
Step = Tuple["Unit", cst.Call]


def step_calls(units: List["Unit"], index: int) -> List[Step]:
    """Every `<optimizer>.step(...)` of amp's optimizer `index`, in every file."""
    found = []
    for unit in units:
        for call in unit.analysis.walk(unit.analysis.module, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "step" and unit.ties.optimizer(func.value) == index:
                found.append((unit, call))
    return found


def plan_steps(planner: "ScaleLossPlanner", sites: List["Site"]) -> bool:
    """Rewrite every step of every scaled optimizer, or none."""
    _flag_patched_optimizers(planner.units)
    planned = []
    for scaler in planner.scalers:
        steps = {index: step_calls(planner.units, index) for index in scaler.optimizers}
        site = next(site for site in sites if site.loss_id in scaler.loss_ids)
        missing = [planner.optimizer_name(index) for index, calls in steps.items() if not calls]
        if missing:
            site.unit.plan.todo(site.statement, f"no `{missing[0]}.step()` where migrate can see it; step it with "
                                                f"`{scaler.name}.step({missing[0]})` then `{scaler.name}.update()`")
            continue
        own_sites = [other for other in sites if other.loss_id in scaler.loss_ids]
        early = [step for calls in steps.values() for step in calls if _before_every_backward(step, own_sites)]
        steps = {index: [step for step in calls if not any(step[1] is call for _, call in early)]
                 for index, calls in steps.items()}
        if any(not calls for calls in steps.values()):
            site.unit.plan.todo(site.statement, f"no step after this scaled backward where migrate can see it; step "
                                                f"with `{scaler.name}.step(optimizer)` then `{scaler.name}.update()`")
            continue
        for unit, call in early:
            unit.plan.comment(call, f"`{unit.analysis.code(call)}` runs before any scaled backward, so it stays a "
                                    f"plain step ({scaler.name}.step would refuse it: nothing was scaled yet)")
        bad = [(unit, call) for calls in steps.values() for unit, call in calls if not _plain(unit, call)]
        for unit, call in bad:
            unit.plan.todo(call, f"write this step as `{scaler.name}.step(optimizer)` then `{scaler.name}.update()` "
                                 "(GradScaler.step takes no closure)")
        for unit, call in (step for calls in steps.values() for step in calls):
            why = _step_hazard(planner, unit, call, own_sites)
            if why is not None:
                unit.plan.todo(call, f"{why}; GradScaler.step needs grads that {scaler.name}.scale(...) scaled since "
                                     "the last update: step the unscaled grads with a plain `optimizer.step()` "
                                     "of their own, or scale every backward before this step")
                bad.append((unit, call))
        for unit, call in (step for calls in steps.values() for step in calls):
            if not unit.ties.reaches_scaler(call):
                unit.plan.todo(call, f"this step needs {scaler.name}.step/.update, but the GradScaler is not "
                                     "reachable here: pass it in like the optimizer and run migrate again")
                bad.append((unit, call))
        if not bad:
            planned.append((scaler, steps))
    if len(planned) != len(planner.scalers):
        return False
    return all([_rewrite(scaler, steps, planner) for scaler, steps in planned])


def _step_hazard(planner: "ScaleLossPlanner", unit: "Unit", call: cst.Call, sites: List["Site"]) -> Optional[str]:
    """Why a step of an amp optimizer cannot become `scaler.step`: an unscaled backward in its function (a
    regulariser's `reg.backward()`: the GradScaler would divide those grads by the scale), or a step that runs
    before the scaled backward of its iteration (GradScaler.step refuses it). A step in a helper that receives
    the optimizer is judged where the helper is called."""
    analysis = unit.analysis
    owner = analysis.enclosing_scope_owner(call)
    places: List[Tuple["Unit", cst.CSTNode]] = [(unit, call)]
    calls = unit.ties.calls_of(owner)
    backward_here = any(site.unit is unit and analysis.within(site.statement, owner) for site in sites) \
        or any(position < analysis.position(call) for position in _backward_points(unit, call, sites))
    if calls is not None and not backward_here:  # (a step after a helper that holds the scaled backward: judged here)
        places = [(other, node) for other in planner.units for key, node in calls if key == other.key]
        for other, node in places:
            if not any(position < other.analysis.position(node) for position in _backward_points(other, node, sites)):
                return f"this step (through `{other.analysis.code(node)}`) runs before any scaled backward there"
    for place_unit, node in places:
        place = place_unit.analysis
        scope = place.enclosing_scope_owner(node) or place.module
        for backward in place.walk(scope, cst.Call):
            func = backward.func
            if isinstance(func, cst.Attribute) and func.attr.value == "backward" and not backward.args \
                    and not planner.flag_guards.scaled_or_amp_off(place_unit, backward) \
                    and not _cleared_before(planner, place_unit, backward, node):
                return (f"`{place.code(backward)}` in this function is a backward amp never scaled, and this step "
                        "would go through the GradScaler")
        loops = [a for a in place.ancestors(node) if isinstance(a, (cst.For, cst.While))]
        inner = loops[0] if loops else None
        in_loop = [site for site in sites if site.unit is place_unit and inner is not None
                   and place.within(site.statement, inner)]
        if in_loop and all(place.position(site.statement) > place.position(node) for site in in_loop):
            return "this step runs before the scaled backward of its loop iteration"
    return None


def _cleared_before(planner: "ScaleLossPlanner", unit: "Unit", backward: cst.Call, step: cst.Call) -> bool:
    """Whether the grads of an unscaled `backward` are cleared before `step` can read them: a later statement of
    its block calls `zero_grad` of the stepping optimizer or of amp's only model, with the step not in between
    (Jasper's warm-up `loss.backward(); model.zero_grad()` before its training loop), so they reach no step."""
    analysis = unit.analysis
    stepped = unit.ties.optimizer(step.func.value)
    sole_model = planner.setup.models[0] if len(planner.setup.models) == 1 else None

    def clears(call: cst.Call) -> bool:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "zero_grad"):
            return False
        owner = call.func.value
        return unit.ties.optimizer(owner) == stepped or (sole_model is not None and dotted_text(owner) == sole_model)

    statement = analysis.statement_of(backward)
    body = list(analysis.block_of(statement).body)
    later = body[body.index(statement) + 1:]
    for index, following in enumerate(later):
        if any(clears(call) for call in analysis.walk(following, cst.Call)):
            return not any(following_step is step or analysis.within(step, following_step)
                           for following_step in later[:index + 1])
    return False


def _backward_points(unit: "Unit", node: cst.CSTNode, sites: List["Site"]) -> List[int]:
    """Positions, in the function holding `node`, of scaled backward passes: scale_loss blocks and calls of
    module-level functions that hold one."""
    analysis = unit.analysis
    scope = analysis.enclosing_scope_owner(node) or analysis.module
    holders = {statement.name.value for statement in analysis.module.body if isinstance(statement, cst.FunctionDef)
               and any(site.unit is unit and analysis.within(site.statement, statement) for site in sites)}
    points = [analysis.position(site.statement) for site in sites if site.unit is unit
              and analysis.enclosing_scope_owner(site.statement) is analysis.enclosing_scope_owner(node)]
    points += [analysis.position(call) for call in analysis.walk(scope, cst.Call)
               if isinstance(call.func, cst.Name) and call.func.value in holders]
    return points


def _before_every_backward(step: Step, sites: List["Site"]) -> bool:
    """Whether a step runs before every scaled backward of its optimizer: each of them follows it in its own
    function, and no loop holds both (UNITER's `optimizer.zero_grad(); optimizer.step()` after amp.initialize)."""
    unit, call = step
    analysis = unit.analysis
    owner = analysis.enclosing_scope_owner(call)
    if not sites or any(site.unit is not unit or analysis.enclosing_scope_owner(site.statement) is not owner
                        for site in sites):
        return False
    loops = [node for node in analysis.ancestors(call) if isinstance(node, (cst.For, cst.While))]
    return all(analysis.position(site.statement) > analysis.position(call) and not any(
        analysis.within(site.statement, loop) for loop in loops) for site in sites)


def _plain(unit: "Unit", call: cst.Call) -> bool:
    small = unit.analysis.small_statement_of(call)
    return not call.args and isinstance(small, cst.Expr) and small.value is call


def _rewrite(scaler: "Scaler", steps: Dict[int, List[Step]], planner: "ScaleLossPlanner") -> bool:
    everything = [step for calls in steps.values() for step in calls]
    if len(scaler.optimizers) == 1:
        updates = {id(call) for _, call in everything}
    else:
        places = {(id(unit), id(unit.analysis.block_of(unit.analysis.statement_of(call)))) for unit, call in everything}
        if len(places) != 1 or any(len(calls) != 1 for calls in steps.values()):
            names = ", ".join(planner.optimizer_name(index) for index in scaler.optimizers)
            unit, call = everything[0]
            unit.plan.todo(call, f"{names} share {scaler.name} but step in different places; call "
                                 f"`{scaler.name}.step(...)` for each, then `{scaler.name}.update()` once per iteration")
            return False
        unit = everything[0][0]
        updates = {id(max(everything, key=lambda step: unit.analysis.position(step[1]))[1])}
    for unit, call in everything:
        optimizer = unit.analysis.code(call.func.value)
        unit.plan.replace_small(unit.analysis.small_statement_of(call), _step_edit(scaler.name, optimizer,
                                                                                  id(call) in updates))
    return True


def _flag_patched_optimizers(units: List["Unit"]) -> None:
    for unit in units:
        for assign in unit.analysis.walk(unit.analysis.module, (cst.Assign, cst.AugAssign)):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                if isinstance(target, cst.Attribute) and target.attr.value in PATCHED_OPTIMIZER_METHODS \
                        and unit.ties.optimizer(target.value) is not None:
                    unit.plan.todo(assign, f"`{dotted_text(target)}` is replaced here; torch.amp.GradScaler.step "
                                           "calls the optimizer's step itself and skips it on inf/NaN gradients: "
                                           "check the replacement still works under it")


def _step_edit(scaler: str, optimizer: str, update: bool):
    def edit(_: cst.BaseSmallStatement):
        produced = [small_statement(f"{scaler}.step({optimizer})")]
        if update:
            produced.append(small_statement(f"{scaler}.update()"))
        return produced

    return edit
