"""`with amp.scale_loss(loss, optimizer[s], loss_id=k) as scaled: scaled.backward()` and the steps.

Each block becomes `scaler.scale(loss).backward()` (plain `loss.backward()` when nothing is scaled);
each `optimizer.step()` of a scaled optimizer becomes `scaler.step(optimizer)` then `scaler.update()`.
apex gave every loss id its own scaler; torch.amp.GradScaler unscales an optimizer's gradients once per
step, so loss ids whose backward passes meet in one optimizer's gradients share one GradScaler (the
DCGAN pattern: two losses into the discriminator); every other loss id gets its own. `delay_unscale`
disappears: a GradScaler only unscales at the step, so gradient accumulation needs nothing but the
script's own "step on the last micro-batch". The autocast regions are found here too (regions.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import ApexUse, dotted_text
from apexlite.migrate.edits import Plan, expression, small_statement
from apexlite.migrate.initialize import AUTOCAST, AmpSetup
from apexlite.migrate.regions import RegionFinder
from apexlite.migrate.values import bind, elements, literal

SCALE_LOSS_PARAMS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")
PATCHED_OPTIMIZER_METHODS = ("step", "zero_grad")


@dataclass
class Site:
    """One `with amp.scale_loss(...)` block."""

    use: ApexUse
    statement: cst.With
    loss: cst.BaseExpression
    scaled_name: str
    optimizers: List[int]  # indices into setup.optimizer_nodes
    loss_id: int


@dataclass
class Scaler:
    """One torch.amp.GradScaler: the loss ids it scales and the optimizers it steps."""

    name: str
    loss_ids: List[int]
    optimizers: List[int] = field(default_factory=list)


class ScaleLossPlanner:
    """Plans the scale_loss blocks, the scalers, the optimizer steps and the autocast regions."""

    def __init__(self, plan: Plan, setup: AmpSetup) -> None:
        self.plan = plan
        self.analysis = plan.analysis
        self.setup = setup
        self.scalers: List[Scaler] = []
        self.scaler_of_loss: Dict[int, Scaler] = {}
        self.scaler_of_optimizer: Dict[int, Scaler] = {}

    # --- reading ---------------------------------------------------------------------------------------
    def _optimizer_index(self, node: cst.BaseExpression) -> Optional[int]:
        for index, target in enumerate(self.setup.optimizer_nodes):
            if self.analysis.same_binding(node, target):
                return index
        return None

    def _read(self, use: ApexUse) -> Optional[Site]:
        call = self.analysis.call_of(use)
        item = self.analysis.parent(call) if call is not None else None
        statement = self.analysis.parent(item) if isinstance(item, cst.WithItem) else None
        if not isinstance(statement, cst.With) or len(statement.items) != 1 or item.asname is None \
                or not isinstance(item.asname.name, cst.Name) or statement.asynchronous is not None:
            self.plan.todo(use.node, "amp.scale_loss is used other than as `with amp.scale_loss(loss, optimizer) as "
                                     "scaled_loss:`; write `scaler.scale(loss).backward()` with a torch.amp.GradScaler")
            return None
        bound = bind(call, SCALE_LOSS_PARAMS)
        if bound.error or bound.value("loss") is None or bound.value("optimizers") is None:
            self.plan.todo(call, f"amp.scale_loss cannot be read: {bound.error or 'loss and optimizers are needed'}")
            return None
        loss_id = literal(self.analysis, bound.value("loss_id")) if bound.value("loss_id") is not None else 0
        if not isinstance(loss_id, int) or not 0 <= loss_id < self.setup.num_losses:
            self.plan.todo(call, f"loss_id must be a literal in 0..{self.setup.num_losses - 1} (num_losses="
                                 f"{self.setup.num_losses}) for migrate to pick its scaler")
            return None
        optimizers = elements(bound.value("optimizers")) or []
        indices = [self._optimizer_index(node) for node in optimizers]
        if not optimizers or None in indices:
            self.plan.todo(call, "this scale_loss names an optimizer migrate cannot tie to amp.initialize's (is it "
                                 "inside a helper function?); pass the torch.amp.GradScaler in and write "
                                 "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`")
            return None
        return Site(use, statement, bound.value("loss"), item.asname.name.value, indices, loss_id)

    # --- planning --------------------------------------------------------------------------------------
    def plan_all(self) -> None:
        sites = [self._read(use) for use in self.analysis.uses_of(apis.SCALE_LOSS)]
        for use in self.analysis.uses_of(apis.SCALE_LOSS):
            self.plan.handle(use.node)
        sites = [site for site in sites if site is not None]
        if not sites:
            return
        if self.setup.scaled:
            self._group(sites)
            if not self._plan_steps(sites):
                return
        if self.setup.recipe == AUTOCAST:
            self._plan_regions(sites)
        for site in sites:
            self._plan_site(site)

    def _group(self, sites: List[Site]) -> None:
        """Union the loss ids that share an optimizer; one Scaler per group, named after its optimizer."""
        parent = {site.loss_id: site.loss_id for site in sites}

        def root(loss_id: int) -> int:
            while parent[loss_id] != loss_id:
                loss_id = parent[loss_id]
            return loss_id

        first_loss_of_optimizer: Dict[int, int] = {}
        for site in sites:
            for optimizer in site.optimizers:
                other = first_loss_of_optimizer.setdefault(optimizer, site.loss_id)
                parent[root(site.loss_id)] = root(other)
        groups: Dict[int, Scaler] = {}
        for loss_id in sorted(parent):
            scaler = groups.setdefault(root(loss_id), Scaler("", []))
            scaler.loss_ids.append(loss_id)
        for site in sites:
            scaler = groups[root(site.loss_id)]
            scaler.optimizers.extend(index for index in site.optimizers if index not in scaler.optimizers)
        self.scalers = list(groups.values())
        for scaler in self.scalers:
            names = [self.setup.optimizers[index] for index in scaler.optimizers]
            single = len(self.scalers) == 1
            wanted = "scaler" if single else (f"scaler_{names[0].replace('.', '_')}" if len(names) == 1 else
                                              f"scaler{scaler.loss_ids[0]}")
            scaler.name = self.plan.fresh_name(wanted)
            self.scaler_of_loss.update({loss_id: scaler for loss_id in scaler.loss_ids})
            self.scaler_of_optimizer.update({index: scaler for index in scaler.optimizers})
        shared = [scaler for scaler in self.scalers if len(scaler.loss_ids) > 1]
        for scaler in shared:
            self.plan.notes.append(f"loss ids {', '.join(map(str, scaler.loss_ids))} share {scaler.name}: their "
                                   "gradients meet in one optimizer, which GradScaler unscales once per step")

    def _step_calls(self, index: int) -> List[cst.Call]:
        target = self.setup.optimizer_nodes[index]
        calls = []
        for call in self.analysis.walk(self.analysis.module, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "step" \
                    and self.analysis.same_binding(func.value, target):
                calls.append(call)
        return calls

    def _plan_steps(self, sites: List[Site]) -> bool:
        """Rewrite every step of every scaled optimizer, or none (TODOs say why)."""
        self._flag_patched_optimizers()
        planned = []
        for scaler in self.scalers:
            steps = {index: self._step_calls(index) for index in scaler.optimizers}
            site = next(site for site in sites if site.loss_id in scaler.loss_ids)
            missing = [self.setup.optimizers[index] for index, calls in steps.items() if not calls]
            if missing:
                self.plan.todo(site.statement, f"no `{missing[0]}.step()` where migrate can see it; step it with "
                                               f"`{scaler.name}.step({missing[0]})` then `{scaler.name}.update()`")
                continue
            smalls = {index: [self.analysis.small_statement_of(call) for call in calls] for index, calls in steps.items()}
            bad = [call for index, calls in steps.items() for call, small in zip(calls, smalls[index])
                   if call.args or not (isinstance(small, cst.Expr) and small.value is call)]
            for call in bad:
                self.plan.todo(call, f"write this step as `{scaler.name}.step(optimizer)` then `{scaler.name}.update()` "
                                     "(GradScaler.step takes no closure)")
            if not bad:
                planned.append((scaler, smalls))
        if len(planned) != len(self.scalers):
            return False
        return all([self._rewrite_steps(scaler, smalls) for scaler, smalls in planned])

    def _rewrite_steps(self, scaler: Scaler, statements: Dict[int, List[cst.BaseSmallStatement]]) -> bool:
        everything = sorted((small for smalls in statements.values() for small in smalls), key=self.analysis.position)
        if len(scaler.optimizers) == 1:
            updates = set(map(id, everything))
        else:
            blocks = {id(self.analysis.block_of(self.analysis.statement_of(small))) for small in everything}
            if len(blocks) != 1 or any(len(smalls) != 1 for smalls in statements.values()):
                names = ", ".join(self.setup.optimizers[index] for index in scaler.optimizers)
                self.plan.todo(everything[0], f"{names} share {scaler.name} but step in different places; call "
                                              f"`{scaler.name}.step(...)` for each, then `{scaler.name}.update()` "
                                              "once per iteration")
                return False
            updates = {id(everything[-1])}
        for index, smalls in statements.items():
            optimizer = self.setup.optimizers[index]
            for small in smalls:
                self.plan.replace_small(small, _step_edit(scaler.name, optimizer, id(small) in updates))
        return True

    def _flag_patched_optimizers(self) -> None:
        for assign in self.analysis.walk(self.analysis.module, (cst.Assign, cst.AugAssign)):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                if isinstance(target, cst.Attribute) and target.attr.value in PATCHED_OPTIMIZER_METHODS and any(
                        dotted_text(target.value) == name for name in self.setup.optimizers):
                    self.plan.todo(assign, f"`{dotted_text(target)}` is replaced here; torch.amp.GradScaler.step "
                                           "calls the optimizer's step itself and skips it on inf/NaN gradients: "
                                           "check the replacement still works under it")

    def _plan_regions(self, sites: List[Site]) -> None:
        markers: List[cst.CSTNode] = [site.statement for site in sites] + [self.setup.call]
        for index in range(len(self.setup.optimizer_nodes)):
            markers.extend(self._step_calls(index))
        finder = RegionFinder(self.plan, self.setup.models, markers)
        for site in sites:
            finder.find(site.statement, site.loss)
        header = autocast_header(self.setup)
        for region in finder.regions:
            body = list(region.block.body)
            self.plan.wrap(body[region.start], body[region.end], header)

    def _plan_site(self, site: Site) -> None:
        scaler = self.scaler_of_loss.get(site.loss_id)
        loss = self.analysis.code(site.loss)
        scaled = f"{scaler.name}.scale({loss})" if scaler is not None else _parenthesised(site.loss, loss)
        self.plan.replace_statement(site.statement, _unwrap_edit(site.scaled_name, scaled))
        self.plan.needs_torch = True


def _parenthesised(node: cst.BaseExpression, code: str) -> str:
    return code if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f"({code})"


def autocast_header(setup: AmpSetup):
    enabled = f", enabled={setup.enabled}" if setup.enabled else ""
    code = f"with torch.autocast(device_type={setup.device_expr}, dtype=torch.{setup.dtype}{enabled}):\n    pass\n"
    return lambda: cst.parse_statement(code)


def _step_edit(scaler: str, optimizer: str, update: bool):
    def edit(_: cst.BaseSmallStatement):
        produced = [small_statement(f"{scaler}.step({optimizer})")]
        if update:
            produced.append(small_statement(f"{scaler}.update()"))
        return produced

    return edit


def _unwrap_edit(scaled_name: str, scaled: str):
    """The body of the `with` in place of the `with`: `scaled.backward(...)` on the scaled loss itself,
    else `scaled_name = <scaled loss>` first."""

    def edit(updated: cst.With) -> List[cst.BaseStatement]:
        body = updated.body
        if isinstance(body, cst.SimpleStatementSuite):
            statements: List[cst.BaseStatement] = [cst.SimpleStatementLine(body=list(body.body))]
        else:
            statements = list(body.body)
        header_comment = body.header.comment if isinstance(body, cst.IndentedBlock) else body.trailing_whitespace.comment
        if len(statements) == 1 and _is_backward_of(statements[0], scaled_name):
            line = statements[0]
            call = line.body[0].value
            new_call = call.with_changes(func=call.func.with_changes(value=expression(scaled)))
            statements = [line.with_changes(body=[line.body[0].with_changes(value=new_call)])]
        else:
            statements = [cst.parse_statement(f"{scaled_name} = {scaled}\n"), *statements]
        if header_comment is not None:
            from apexlite.migrate.edits import comment_line

            first = statements[0]
            statements[0] = first.with_changes(leading_lines=[*first.leading_lines, comment_line(header_comment.value)])
        return statements

    return edit


def _is_backward_of(line: cst.BaseStatement, name: str) -> bool:
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr)):
        return False
    call = line.body[0].value
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" \
        and isinstance(call.func.value, cst.Name) and call.func.value.value == name
