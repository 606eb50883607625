"""Gradients a script reads or changes between a scaled backward and its step (`p.grad.data.clamp_(-1, 1)`, an L1
penalty added to `.grad`, a norm it logs): apex had unscaled them when scale_loss exited, torch.amp's GradScaler
leaves them multiplied by the loss scale until `scaler.unscale_(optimizer)`. Each such use, where no unscale_ or
clip (which gets one, clipping.py) comes first in its function, is a TODO. Operations the scale passes through
unchanged (zero_, mul_, div_, an inf/NaN test, reading the shape) and tests for None are not uses."""
from __future__ import annotations

from typing import TYPE_CHECKING, List

import libcst as cst

from apexlite import api_status
from apexlite.migrate.analysis import dotted_text
from apexlite.migrate.steps import step_calls

if TYPE_CHECKING:
    from apexlite.migrate.reach import Unit
    from apexlite.migrate.scale_loss import ScaleLossPlanner

# methods of a grad, and torch functions of one, whose result the loss scale changes other than by the scale itself
SCALE_SENSITIVE = frozenset({
    "clamp", "clamp_", "clip", "clip_", "add", "add_", "sub", "sub_", "addcmul_", "addcdiv_", "copy_", "fill_",
    "masked_fill_", "index_fill_", "norm", "abs", "abs_", "sign", "sign_", "max", "min", "sum", "mean", "pow", "pow_",
    "sqrt", "item", "tolist", "std", "var"})


def _grad_chain(analysis, node: cst.Attribute) -> cst.CSTNode:
    """`x.grad` or `x.grad.data`: the outermost of the two."""
    parent = analysis.parent(node)
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "data":
        return parent
    return node


def _sensitive_use(analysis, grad: cst.Attribute) -> bool:
    chain = _grad_chain(analysis, grad)
    parent = analysis.parent(chain)
    if isinstance(parent, cst.Attribute) and parent.value is chain:  # a method of the grad
        call = analysis.parent(parent)
        return parent.attr.value in SCALE_SENSITIVE and isinstance(call, cst.Call) and call.func is parent
    if isinstance(parent, cst.Arg):  # torch.norm(p.grad), torch.clamp(p.grad, ...)
        call = analysis.parent(parent)
        name = (dotted_text(call.func) or "") if isinstance(call, cst.Call) else ""
        return name.startswith("torch.") and name.rsplit(".", 1)[-1] in SCALE_SENSITIVE and call.args[0] is parent
    return False


def _unscaling_call(call: cst.Call) -> bool:
    name = (dotted_text(call.func) or "").rsplit(".", 1)[-1]
    return name in api_status.CLIP_FUNCTIONS or name == "unscale_"


def plan_grad_reads(unit: "Unit", planner: "ScaleLossPlanner") -> None:
    """A TODO at each scale-sensitive use of `.grad` after a scaled backward in its function, before its step."""
    analysis = unit.analysis
    for site in (site for site in planner.sites if site.unit is unit):
        owner = analysis.enclosing_scope_owner(site.statement)
        scope = owner if owner is not None else analysis.module
        after = analysis.position(site.statement)
        steps = [analysis.position(call) for index in site.optimizers for step_unit, call in step_calls([unit], index)
                 if step_unit is unit and analysis.enclosing_scope_owner(call) is owner and
                 analysis.position(call) > after]
        until = min(steps, default=None)
        unscaled = [analysis.position(call) for call in analysis.walk(scope, cst.Call) if _unscaling_call(call)]
        scaler = planner.scaler_of_optimizer.get(site.optimizers[0]) if site.optimizers else None
        unscale = f"{scaler.name}.unscale_(optimizer)" if scaler is not None else "scaler.unscale_(optimizer)"
        uses: List[cst.Attribute] = []
        for node in analysis.walk(scope, cst.Attribute):
            if node.attr.value != "grad" or analysis.enclosing_scope_owner(node) is not owner:
                continue
            position = analysis.position(node)
            if position <= after or (until is not None and position > until) \
                    or any(after < point < position for point in unscaled):
                continue
            if _sensitive_use(analysis, node) and not any(analysis.within(node, use) for use in uses):
                uses.append(node)
                unit.plan.todo(_grad_chain(analysis, node),
                               f"this uses gradients that torch.amp's GradScaler still multiplies by the loss scale "
                               f"(apex had unscaled them when scale_loss exited): call `{unscale}` before it, once "
                               "per step, for the optimizer that steps these params")
