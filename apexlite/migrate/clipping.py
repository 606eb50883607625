"""`amp.master_params(optimizer)`: the parameters whose gradients a script clips.

Under native AMP the gradients are still multiplied by the loss scale until `scaler.unscale_(optimizer)`
runs, so clipping them first would clip scaled values (torch's AMP example "Gradient clipping").
A clip call (`torch.nn.utils.clip_grad_norm_(amp.master_params(opt), ...)`) or a `for` loop over the
params gets `scaler.unscale_(opt)` right before it; the params become the model's parameters when the
script has one model and one optimizer, else the optimizer's own params. Any other use with a scaler
(the gradients might be read) is a TODO.
"""
from __future__ import annotations

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import dotted_text
from apexlite.migrate.edits import Plan, expression, small_statement, statement
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.scale_loss import ScaleLossPlanner

CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")


def params_code(setup: AmpSetup, optimizer: int) -> str:
    if len(setup.model_nodes) == 1 and len(setup.optimizer_nodes) == 1:
        return f"{setup.models[0]}.parameters()"
    return f'(p for group in {setup.optimizers[optimizer]}.param_groups for p in group["params"])'


def _clip_call(plan: Plan, call: cst.Call) -> bool:
    """Whether `call` is the first argument of a gradient-clipping function."""
    arg = plan.analysis.parent(call)
    outer = plan.analysis.parent(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(outer, cst.Call) and outer.args and outer.args[0] is arg and \
        (dotted_text(outer.func) or "").rsplit(".", 1)[-1] in CLIP_FUNCTIONS


def plan_master_params(plan: Plan, setup: AmpSetup, scale_loss: ScaleLossPlanner) -> None:
    analysis = plan.analysis
    for use in analysis.uses_of(apis.MASTER_PARAMS):
        plan.handle(use.node)
        call = analysis.call_of(use)
        if call is None or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            plan.todo(use.node, "amp.master_params is used other than as amp.master_params(optimizer); use the "
                                "optimizer's params (after scaler.unscale_(optimizer) if gradients are read)")
            continue
        index = scale_loss._optimizer_index(call.args[0].value)
        if index is None:
            plan.todo(call, "amp.master_params names an optimizer migrate cannot tie to amp.initialize's; use its "
                            "params (after scaler.unscale_(optimizer) if gradients are read)")
            continue
        scaler = scale_loss.scaler_of_optimizer.get(index)
        params = params_code(setup, index)
        plan.replace_expression(call, lambda _, params=params: expression(params))
        if scaler is None:
            continue
        unscale = f"{scaler.name}.unscale_({setup.optimizers[index]})"
        parent = analysis.parent(call)
        small = analysis.small_statement_of(call)
        if _clip_call(plan, call) and small is not None and small not in plan.small:
            plan.replace_small(small, lambda updated, unscale=unscale: [small_statement(unscale), updated])
        elif isinstance(parent, cst.For) and parent.iter is call and parent not in plan.statements:
            plan.replace_statement(parent, lambda updated, unscale=unscale: [statement(unscale + "\n"), updated])
        else:
            plan.todo(call, f"if this reads gradients, call `{unscale}` first (they are still multiplied by the "
                            "loss scale until then), once per step")
