"""`amp.master_params(optimizer)`: the parameters whose gradients a script clips.

Under native AMP the gradients are still multiplied by the loss scale until `scaler.unscale_(optimizer)`
runs, so clipping them first would clip scaled values (torch's AMP example "Gradient clipping").
A clip call (`torch.nn.utils.clip_grad_norm_(amp.master_params(opt), ...)`) or a `for` loop over the
params gets `scaler.unscale_(opt)` right before it; the params become the model's parameters when the
script has one model and one optimizer, else the optimizer's own params. Where the optimizer has stepped
since its scaled backward, its grads are unscaled already and the clip stays as it is. Any other use with a
scaler (the gradients might be read) is a TODO.

A clip of other params (`clip_grad_norm_(model.parameters(), ...)`: apex had unscaled the grads when
`scale_loss` exited, so that was right under apex) gets the same `scaler.unscale_(optimizer)` where the
script has one optimizer whose name means the same at the clip; else a TODO, never a silent clip of scaled
grads. A function that also clips `amp.master_params` is left as it is: that is the script's amp path (which
gets its `unscale_`), and the other clip its path without amp (`if args.fp16: ... else: ...`), where the
GradScaler is off; a second `unscale_` in one step would raise.
"""
from __future__ import annotations

import libcst as cst

from apexlite import api_status
from apexlite.migrate import apis
from apexlite.migrate.analysis import dotted_text
from apexlite.migrate.edits import expression, small_statement, statement
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.reach import Unit
from apexlite.migrate.scale_loss import ScaleLossPlanner
from apexlite.migrate.steps import step_calls


def params_code(unit: Unit, setup: AmpSetup, optimizer: cst.BaseExpression) -> str:
    """The parameters `amp.master_params(optimizer)` stood for: the model's, where amp.initialize's single
    model is in reach under its name, else the optimizer's own."""
    if len(setup.model_nodes) == 1 and len(setup.optimizer_nodes) == 1 and unit.home \
            and unit.analysis.same_binding(optimizer, setup.optimizer_nodes[0]):
        return f"{setup.models[0]}.parameters()"
    return f'(p for group in {unit.analysis.code(optimizer)}.param_groups for p in group["params"])'


def _clip_call(unit: Unit, call: cst.Call) -> bool:
    """Whether `call` is the first argument of a gradient-clipping function."""
    arg = unit.analysis.parent(call)
    outer = unit.analysis.parent(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(outer, cst.Call) and outer.args and outer.args[0] is arg and \
        (dotted_text(outer.func) or "").rsplit(".", 1)[-1] in api_status.CLIP_FUNCTIONS


def _between_steps(unit: Unit, call: cst.CSTNode, index: int) -> bool:
    """Whether a clip in a loop can run where the optimizer does not step: a step of optimizer `index` in the
    same function sits under an `if` or loop inside the loop they share that the clip is not under (Swin's
    gradient accumulation clips every micro-batch and steps every N), or every step of it in that function lies in
    another branch of an `if` the clip is under. GradScaler unscales once per step."""
    analysis = unit.analysis
    owner = analysis.enclosing_scope_owner(call)
    steps = [step for _, step in step_calls([unit], index)]
    calls = unit.ties.calls_of(owner)
    if calls is not None and not any(analysis.enclosing_scope_owner(step) is owner for step in steps):
        # a clip in a helper (a backward helper that also clips): judged where the helper is called
        return any(_between_steps(unit, place, index) for key, place in calls
                   if key == unit.key and analysis.enclosing_scope_owner(place) is not owner)
    around_clip = [call, *analysis.ancestors(call)]
    around_ids = {id(node) for node in around_clip}
    own_steps = [step for step in steps if analysis.enclosing_scope_owner(step) is owner]
    other_branch = 0
    for step in own_steps:
        guarded, shared, below = False, None, step
        for node in analysis.ancestors(step):
            if id(node) in around_ids:
                shared = node
                break
            guards = isinstance(node, (cst.For, cst.While, cst.Try)) or \
                isinstance(node, cst.If) and not _every_branch_steps(unit, node, index)
            guarded, below = guarded or guards, node
        if isinstance(shared, cst.If) and not any(node is below for node in around_clip):
            other_branch += 1  # `if accumulating: ... step ... else: clip; step`: never in the clip's iteration
            continue
        in_loop = shared is not None and any(isinstance(node, (cst.For, cst.While)) and node is not owner
                                             for node in [shared, *analysis.ancestors(shared)])
        if guarded and in_loop:
            return True
    if not own_steps or other_branch < len(own_steps):
        return False
    for node in analysis.ancestors(call):  # no step can follow the clip in its iteration: wrong in a loop
        if node is owner:
            return False
        if isinstance(node, (cst.For, cst.While)):
            return True
    return False


def _stepped_since_backward(unit: Unit, scale_loss: ScaleLossPlanner, call: cst.Call, index: int) -> bool:
    """Whether, where `call` runs, optimizer `index` has stepped since its last scaled backward in the same function
    (reading on from the function's end when none comes before: the loop's previous pass). A step leaves the grads
    unscaled under apex and under torch.amp alike, so the clip needs no `unscale_`, and one would mark the next
    backward's grads unscaled (CycleGAN's discriminator block clipping the generator's masters)."""
    analysis = unit.analysis
    owner = analysis.enclosing_scope_owner(call)
    backwards = [(analysis.position(site.statement), False) for site in scale_loss.sites
                 if site.unit is unit and index in site.optimizers
                 and analysis.enclosing_scope_owner(site.statement) is owner]
    if not backwards:
        return False  # a clipping helper: judged as before, where its callers are
    steps = [(analysis.position(step), True) for _, step in step_calls([unit], index)
             if analysis.enclosing_scope_owner(step) is owner]
    events = sorted(backwards + steps)
    before = [stepped for position, stepped in events if position < analysis.position(call)]
    return (before or [stepped for _, stepped in events])[-1]


def _every_branch_steps(unit: Unit, branch: cst.If, index: int) -> bool:
    """Whether each branch of an `if` chain steps optimizer `index`, by `optimizer.step()` or a GradScaler's
    `scaler.step(optimizer)` (Transformer-XL's `if native_amp: scaler.step(optimizer) else: optimizer.step()`):
    such an `if` chooses how to step, not whether."""
    def steps(node: cst.CSTNode) -> bool:
        return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "step" and (
            unit.ties.optimizer(call.func.value) == index
            or len(call.args) == 1 and unit.ties.optimizer(call.args[0].value) == index)
            for call in unit.analysis.walk(node, cst.Call))

    other = branch.orelse
    if other is None or not steps(branch.body):
        return False
    return _every_branch_steps(unit, other, index) if isinstance(other, cst.If) else steps(other.body)


def _between_steps_todo(unit: Unit, call: cst.Call, unscale: str) -> None:
    unit.plan.todo(call, f"this clip runs on iterations where the optimizer does not step (gradient accumulation); "
                         f"torch.amp's GradScaler unscales once per step, so `{unscale}` cannot go here: clip once, "
                         "after it, right before the step")


def plan_master_params(unit: Unit, setup: AmpSetup, scale_loss: ScaleLossPlanner) -> None:
    analysis, plan = unit.analysis, unit.plan
    for use in analysis.uses_of(apis.MASTER_PARAMS):
        plan.handle(use.node)
        call = analysis.call_of(use)
        if call is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            plan.todo(use.node, "amp.master_params is used other than as amp.master_params(optimizer); use the "
                                "optimizer's params (after scaler.unscale_(optimizer) if gradients are read)")
            continue
        optimizer = call.args[0].value
        index = unit.ties.optimizer(optimizer)
        if index is None:
            plan.todo(call, "amp.master_params names an optimizer migrate cannot tie to amp.initialize's; use its "
                            "params (after scaler.unscale_(optimizer) if gradients are read)")
            continue
        scaler = scale_loss.scaler_of_optimizer.get(index)
        params = params_code(unit, setup, optimizer)
        plan.replace_expression(call, lambda _, params=params: expression(params))
        if scaler is None:
            continue
        unscale = f"{scaler.name}.unscale_({analysis.code(optimizer)})"
        parent = analysis.parent(call)
        small = analysis.small_statement_of(call)
        if not unit.ties.reaches_scaler(call):
            plan.todo(call, f"the gradients are read here, after `{unscale}`, but the GradScaler cannot be read "
                            "here; pass it in like the optimizer and run migrate again")
        elif (_clip_call(unit, call) or isinstance(parent, cst.For) and parent.iter is call) and \
                _stepped_since_backward(unit, scale_loss, call, index):
            continue  # the step left the grads unscaled, as apex's scale_loss had
        elif _clip_call(unit, call) and _between_steps(unit, call, index):
            _between_steps_todo(unit, call, unscale)
        elif _clip_call(unit, call) and small is not None and small not in plan.small:
            plan.replace_small(small, lambda updated, unscale=unscale: [small_statement(unscale), updated])
        elif isinstance(parent, cst.For) and parent.iter is call and parent not in plan.statements:
            plan.replace_statement(parent, lambda updated, unscale=unscale: [statement(unscale + "\n"), updated])
        else:
            plan.todo(call, f"if this reads gradients, call `{unscale}` first (they are still multiplied by the "
                            "loss scale until then), once per step")


def plan_other_clips(unit: Unit, setup: AmpSetup, scale_loss: ScaleLossPlanner) -> None:
    """`scaler.unscale_(optimizer)` before each clip of params other than amp.master_params (module docstring)."""
    analysis, plan = unit.analysis, unit.plan
    if not scale_loss.scalers:
        return
    master_calls = [analysis.call_of(use) or use.node for use in analysis.uses_of(apis.MASTER_PARAMS)]
    master_clips = {id(analysis.enclosing_scope_owner(node)) for node in master_calls}
    optimizer = setup.optimizer_nodes[0] if len(setup.optimizer_nodes) == 1 else None
    scaler = scale_loss.scaler_of_optimizer.get(0) if optimizer is not None else None
    unscale = f"{scaler.name}.unscale_({analysis.code(optimizer)})" if scaler is not None else \
        "scaler.unscale_(optimizer)"
    for call in analysis.nodes(cst.Call):
        if (dotted_text(call.func) or "").rsplit(".", 1)[-1] not in api_status.CLIP_FUNCTIONS or not call.args:
            continue
        if any(call.args[0].value is node for node in master_calls):
            continue  # plan_master_params's
        if id(analysis.enclosing_scope_owner(call)) in master_clips:
            continue
        small = analysis.small_statement_of(call)
        if scaler is not None and _between_steps(unit, call, 0):
            _between_steps_todo(unit, call, unscale)
        elif scaler is not None and unit.home and unit.ties.reaches_scaler(call) and small is not None \
                and small not in plan.small and unit.ties.reads_alike(optimizer, call):
            plan.replace_small(small, lambda updated, unscale=unscale: [small_statement(unscale), updated])
        else:
            plan.todo(call, f"this clips gradients that torch.amp's GradScaler still multiplies by the loss scale "
                            f"(apex had unscaled them when scale_loss exited): call `{unscale}` first, once per "
                            "step, for the optimizer that steps these params")
