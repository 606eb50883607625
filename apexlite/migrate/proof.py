"""What migrate must have found before it claims amp's native recipe: mixed precision is never dropped.

amp.initialize at O1 ran the model's forward passes in fp16 and, through amp.scale_loss, scaled the loss.
migrate puts torch.autocast around a forward pass only where a scale_loss it tied to that amp.initialize
leads it to the loss and the forward pass behind it, and makes a GradScaler only for such scale_loss
calls. When it tied none (timm's pattern: the forward under `with amp_autocast():` where `amp_autocast`
stays `contextlib.suppress` on the apex path, the loss scaled by `loss_scaler = utils.ApexScaler()` from
a module it does not rewrite, which calls amp.scale_loss itself; or an inference script), removing
amp.initialize would train in fp32 or crash once apex is gone. Then the amp part stays, with one TODO at
amp.initialize that says what to write, naming the script's own do-nothing context manager and scaler
object where it has them.
"""
from __future__ import annotations

from typing import List, Optional

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import Analysis, dotted_text
from apexlite.migrate.device import RUNTIME
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.recipes import AUTOCAST
from apexlite.migrate.reach import Unit

DO_NOTHING_CONTEXTS = ("suppress", "nullcontext")  # contextlib's: `with amp_autocast():` does nothing


def unproven(units: List[Unit], setup: AmpSetup, tied_scale_losses: int) -> Optional[str]:
    """The TODO for amp.initialize when migrate tied no amp.scale_loss to it but its recipe needs one (to
    find the forward pass for torch.autocast, or to replace the loss scaling); None when nothing is missing.
    Where the files do call amp.scale_loss but migrate could not tie it, the TODOs there already hold the
    amp part back; this one is added only when it can say more (the script's own context or scaler)."""
    needs_autocast = setup.recipe == AUTOCAST
    needs_scaling = setup.scaled and bool(setup.optimizer_nodes)
    if tied_scale_losses or not (needs_autocast or needs_scaling):
        return None
    analysis = next(unit for unit in units if unit.home).analysis
    context = _do_nothing_context(units, setup) if needs_autocast else None
    scaler = _scaler_object(analysis, setup) if needs_scaling else None
    untied = any(unit.analysis.uses_of(apis.SCALE_LOSS) for unit in units)
    if untied and context is None and scaler is None:
        return None
    device = (f"next({setup.models[0]}.parameters()).device.type" if setup.device == RUNTIME else setup.device_expr)
    runs = " and ".join(filter(None, [f"runs the forward passes in {setup.dtype}" if needs_autocast else "",
                                      "sets up loss scaling for its optimizer" if needs_scaling else ""]))
    unknown = " nor ".join(filter(None, [
        "where the forward pass is" if needs_autocast else "",
        "where the loss is scaled, if it is (code migrate does not rewrite may call amp.scale_loss)"
        if needs_scaling else ""]))
    steps: List[str] = []
    if context is not None:
        steps.append(f"set `{context} = functools.partial(torch.autocast, device_type={device}, "
                     f"dtype=torch.{setup.dtype})` here (it stays `{_value_code(analysis, setup, context)}` on this "
                     f"path, so `with {context}():` runs in fp32)")
    elif needs_autocast:
        enabled = f", enabled={setup.enabled}" if setup.enabled else ""
        steps.append(f"put the forward pass{' and the loss' if needs_scaling else ''} under `with torch.autocast("
                     f"device_type={device}, dtype=torch.{setup.dtype}{enabled}):`")
    if scaler is not None:
        steps.append(f"replace `{scaler}` (it scales the loss with amp.scale_loss in code migrate does not rewrite, "
                     "and keeps apex) with a torch.amp.GradScaler-based scaler, such as timm's NativeScaler, whose "
                     "state_dict() is the GradScaler's")
    elif needs_scaling:
        steps.append(f"if the loss is scaled, scale it with a `torch.amp.GradScaler({device})` instead: "
                     "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`, and "
                     "`scaler.state_dict()` in checkpoints")
    dropped = "mixed precision" if needs_autocast else "the loss scaling"
    return (f"amp.initialize (opt_level {setup.level}) {runs}, but migrate tied no amp.scale_loss to it, so it "
            f"cannot tell {unknown}: removing it would drop {dropped}. By hand: " + "; ".join(steps)
            + "; then delete amp.initialize and the apex import")


def _is_do_nothing(node: Optional[cst.BaseExpression]) -> bool:
    text = dotted_text(node) if node is not None else None
    return text is not None and text.rsplit(".", 1)[-1] in DO_NOTHING_CONTEXTS


def _do_nothing_context(units: List[Unit], setup: AmpSetup) -> Optional[str]:
    """A name amp.initialize's own scope binds to a do-nothing context manager, which some file enters as
    `with NAME():` (directly, or through a parameter of that name)."""
    analysis = next(unit for unit in units if unit.home).analysis
    owner = analysis.enclosing_scope_owner(setup.call)
    bound = {target.target.value for assign in analysis.walk(owner or analysis.module, cst.Assign)
             if _is_do_nothing(assign.value) and analysis.enclosing_scope_owner(assign) is owner
             for target in assign.targets if isinstance(target.target, cst.Name)}
    entered = {dotted_text(item.item.func) for unit in units for with_ in unit.analysis.nodes(cst.With)
               for item in with_.items if isinstance(item.item, cst.Call) and not item.item.args}
    return next((name for name in sorted(bound) if name in entered), None)


def _value_code(analysis: Analysis, setup: AmpSetup, name: str) -> str:
    owner = analysis.enclosing_scope_owner(setup.call) or analysis.module
    for assign in analysis.walk(owner, cst.Assign):
        if _is_do_nothing(assign.value) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                               for t in assign.targets):
            return analysis.code(assign.value)
    return "suppress"


def _scaler_object(analysis: Analysis, setup: AmpSetup) -> Optional[str]:
    """`loss_scaler = utils.ApexScaler()`: a scaler object made beside amp.initialize, only on amp's path
    (in the same `if` branch), to which the script hands its loss scaling."""
    if setup.guard.outermost is None:
        return None
    block = analysis.block_of(analysis.statement_of(setup.call))
    for statement in block.body:
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            continue
        small = statement.body[0]
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.Call) and small is not setup.statement \
                and any("scal" in (dotted_text(node) or "").lower()
                        for node in [small.value.func, *(target.target for target in small.targets)]):
            return analysis.code(small).strip()
    return None
