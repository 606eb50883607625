"""`with amp.scale_loss(loss, optimizer[s], loss_id=k) as scaled: scaled.backward()`.

Each block becomes `scaler.scale(loss).backward()` (plain `loss.backward()` when nothing is scaled);
each `optimizer.step()` of a scaled optimizer becomes `scaler.step(optimizer)` then `scaler.update()`
(steps.py).
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
from apexlite.migrate.analysis import ApexUse
from apexlite.migrate.device import RUNTIME
from apexlite.migrate.edits import comment_line, expression
from apexlite.migrate.flag_guards import FlagGuards
from apexlite.migrate.guards import branch_calls_backward, read_guard, resolves_alike
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.outside_forwards import plan_outside_forwards
from apexlite.migrate.recipes import AUTOCAST, NONE
from apexlite.migrate.reach import Unit
from apexlite.migrate.regions import RegionFinder, modules_in
from apexlite.migrate.steps import plan_steps, step_calls
from apexlite.migrate.values import bind, elements, literal

SCALE_LOSS_PARAMS = ("loss", "optimizers", "loss_id", "model", "delay_unscale", "delay_overflow_check")


@dataclass
class Site:
    """One `with amp.scale_loss(...)` block."""

    unit: Unit
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
    """Plans the scale_loss blocks, the scalers, the optimizer steps and the autocast regions of every file
    of one amp setup (`units`: the file with amp.initialize, and the files it reaches)."""

    def __init__(self, units: List[Unit], setup: AmpSetup, origin: str = "") -> None:
        self.units = units
        self.home = next(unit for unit in units if unit.home)
        self.setup = setup
        self.origin = origin  # where amp.initialize is, for messages in other files ("train.py:12")
        self.scalers: List[Scaler] = []
        self.scaler_of_loss: Dict[int, Scaler] = {}
        self.scaler_of_optimizer: Dict[int, Scaler] = {}
        self.sites: List[Site] = []  # the scale_loss blocks tied to this amp.initialize
        self.flag_guards = FlagGuards(units, setup)

    def optimizer_name(self, index: int) -> str:
        return self.setup.optimizers[index]

    # --- reading ---------------------------------------------------------------------------------------
    def _read(self, unit: Unit, use: ApexUse) -> Optional[Site]:
        analysis, plan = unit.analysis, unit.plan
        call = analysis.call_of(use)
        item = analysis.parent(call) if call is not None else None
        statement = analysis.parent(item) if isinstance(item, cst.WithItem) else None
        if not isinstance(statement, cst.With) or len(statement.items) != 1 or item.asname is None \
                or not isinstance(item.asname.name, cst.Name) or statement.asynchronous is not None:
            plan.todo(use.node, "amp.scale_loss is used other than as `with amp.scale_loss(loss, optimizer) as "
                                "scaled_loss:`; write `scaler.scale(loss).backward()` with a torch.amp.GradScaler")
            return None
        bound = bind(call, SCALE_LOSS_PARAMS)
        if bound.error or bound.value("loss") is None or bound.value("optimizers") is None:
            plan.todo(call, f"amp.scale_loss cannot be read: {bound.error or 'loss and optimizers are needed'}")
            return None
        loss_id = literal(analysis, bound.value("loss_id")) if bound.value("loss_id") is not None else 0
        if not self.setup.scaled:
            loss_id = 0  # nothing is scaled: every loss is a plain backward, whatever its id
        if not isinstance(loss_id, int) or not 0 <= loss_id < self.setup.num_losses:
            plan.todo(call, f"loss_id must be a literal in 0..{self.setup.num_losses - 1} (num_losses="
                            f"{self.setup.num_losses}) for migrate to pick its scaler")
            return None
        optimizers = elements(bound.value("optimizers")) or []
        indices = [unit.ties.optimizer(node) for node in optimizers]
        if not optimizers or None in indices:
            where = f" ({self.origin})" if self.origin else ""
            plan.todo(call, f"this scale_loss's optimizer cannot be tied to amp.initialize's{where}: migrate follows "
                            "the names amp.initialize assigns, the parameters of functions whose every call it sees "
                            "pass the same one of them (a function handed on as a value hides its calls; a helper "
                            "called with a generator's and a discriminator's optimizer gets two), and imports of "
                            "them. Reach the optimizer one of those ways, or pass a torch.amp.GradScaler in beside "
                            "it and write `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
                            "`scaler.update()`")
            return None
        if not unit.ties.reaches_scaler(statement):
            plan.todo(call, "the GradScaler that replaces amp cannot be read here; pass it in like the optimizer and "
                            "run migrate again")
            return None
        if not self._guarded_alike(unit, statement):
            return None
        return Site(unit, use, statement, bound.value("loss"), item.asname.name.value, indices, loss_id)

    def _guarded_alike(self, unit: Unit, statement: cst.With) -> bool:
        """A scale_loss under `if X: ... else: loss.backward()` is exact only when X is one of the
        conditions amp.initialize ran under: the GradScaler is enabled exactly then, and must not step
        gradients the other branch computed unscaled."""
        analysis = unit.analysis
        if self.setup.loss_scale == 1.0 or self.setup.recipe == NONE:
            return True  # no GradScaler (bf16, O0): either branch's plain backward is what it always was
        for condition in read_guard(analysis, statement).conditions:
            if self.flag_guards.means_amp_on(unit, condition) or not branch_calls_backward(
                    analysis, condition, lambda call: self.flag_guards.scaled_or_amp_off(unit, call)):
                continue
            test = analysis.code(condition.test).strip()
            when = f"`{self.setup.enabled}`" if self.setup.enabled else "always"
            unit.plan.todo(statement, f"this scale_loss runs only when `{'' if condition.positive else 'not '}"
                                      f"{test}` and the other branch calls backward unscaled, while the GradScaler "
                                      f"is enabled {when}: with one on and the other off it would step unscaled "
                                      "gradients. Test the same flag here as around amp.initialize (or pass "
                                      "enabled= to it) and run migrate again")
            return False
        return True

    # --- planning --------------------------------------------------------------------------------------
    def plan_all(self) -> None:
        sites = []
        for unit in self.units:
            for use in unit.analysis.uses_of(apis.SCALE_LOSS):
                sites.append(self._read(unit, use))
                unit.plan.handle(use.node)
        sites = self.sites = [site for site in sites if site is not None]
        if not sites:
            return
        if self.setup.scaled:
            self._group(sites)
            if not plan_steps(self, sites):
                return
        if self.setup.recipe == AUTOCAST:
            for unit in self.units:
                self._plan_regions(unit, [site for site in sites if site.unit is unit])
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
            names = [self.optimizer_name(index) for index in scaler.optimizers]
            if self.setup.home_class is not None:  # `self.opt_d` -> `self.scaler_opt_d`, not `self.scaler_self_opt_d`
                names = [name[len(self.setup.home_class.self_name) + 1:] for name in names]
            single = len(self.scalers) == 1
            wanted = "scaler" if single else (f"scaler_{names[0].replace('.', '_')}" if len(names) == 1 else
                                              f"scaler{scaler.loss_ids[0]}")
            scaler.name = self._fresh_name(wanted)
            if self.setup.home_class is not None:  # the class's other methods read it too
                scaler.name = self.setup.home_class.attribute(scaler.name)
            self.scaler_of_loss.update({loss_id: scaler for loss_id in scaler.loss_ids})
            self.scaler_of_optimizer.update({index: scaler for index in scaler.optimizers})
        shared = [scaler for scaler in self.scalers if len(scaler.loss_ids) > 1]
        for scaler in shared:
            self.home.plan.notes.append(f"loss ids {', '.join(map(str, scaler.loss_ids))} share {scaler.name}: "
                                        "their gradients meet in one optimizer, which GradScaler unscales once per "
                                        "step")

    def _fresh_name(self, wanted: str) -> str:
        """A name no file of the migration uses yet."""
        taken = set().union(*(unit.plan.names for unit in self.units))
        candidate, number = wanted, 1
        while candidate in taken or any(candidate in unit.analysis.identifiers for unit in self.units):
            number += 1
            candidate = f"{wanted}_{number}"
        for unit in self.units:
            unit.plan.names.add(candidate)
        return candidate

    def _plan_regions(self, unit: Unit, sites: List[Site]) -> None:
        if not sites:
            return
        markers: List[cst.CSTNode] = [site.statement for site in sites] + ([self.setup.call] if unit.home else [])
        for index in range(len(self.setup.optimizer_nodes)):
            markers.extend(call for step_unit, call in step_calls([unit], index))
        callers = _callers_in(unit)
        for function in {id(site.statement): unit.analysis.enclosing_scope_owner(site.statement) for site in sites}.values():
            markers.extend(callers(function) or ())  # a call of a helper that scales a loss is a backward
        others = modules_in(unit.analysis) if self.setup.level == "O1" else set()  # O1 cast every forward
        finder = RegionFinder(unit.plan, [*self.setup.models, *unit.ties.model_names()], markers, others, callers)
        for site in sites:
            finder.find(site.statement, site.loss)
        for region in finder.regions:
            body = list(region.block.body)
            header = self._autocast_header(unit, body[region.start])
            if header is not None:
                unit.plan.wrap(body[region.start], body[region.end], header)
        plan_outside_forwards(unit, self.setup, finder.forwards_outside())

    def _autocast_header(self, unit: Unit, first: cst.BaseStatement):
        """`with torch.autocast(...)` for a region starting at `first`: its flag as amp.initialize's `if`
        had it, or as the GradScaler (made with that flag) reports it where those names are out of reach."""
        setup = self.setup
        if setup.device == RUNTIME and not unit.ties.reaches_scaler(first):
            unit.plan.todo(first, f"torch.autocast here needs the device type, which migrate reads from the model "
                                  f"next to amp.initialize ({setup.device_expr}); pass it in and run migrate again")
            return None
        enabled = setup.enabled
        if enabled and not (unit.home and resolves_alike(unit.analysis, setup.flags, first)):
            if not self.scalers:
                unit.plan.todo(first, f"torch.autocast here needs `enabled={setup.enabled}` (when amp.initialize "
                                      "ran), but those names mean something else here; pass the flag in under its "
                                      "own name and run migrate again")
                return None
            enabled = f"{self.scalers[0].name}.is_enabled()"
        return autocast_header(setup, enabled)

    def _plan_site(self, site: Site) -> None:
        scaler = self.scaler_of_loss.get(site.loss_id)
        loss = site.unit.analysis.code(site.loss)
        scaled = f"{scaler.name}.scale({loss})" if scaler is not None else _parenthesised(site.loss, loss)
        site.unit.plan.replace_statement(site.statement, _unwrap_edit(site.scaled_name, scaled))
        site.unit.plan.needs_torch = True


def _callers_in(unit: Unit):
    """The calls of a function that receives amp's optimizer, when migrate sees them all in this file."""
    def callers(function) -> Optional[List[cst.Call]]:
        calls = unit.ties.calls_of(function)
        if calls is None or any(key != unit.key for key, _ in calls):
            return None
        return [call for _, call in calls]
    return callers


def _parenthesised(node: cst.BaseExpression, code: str) -> str:
    return code if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else f"({code})"


def autocast_header(setup: AmpSetup, enabled: Optional[str]):
    flag = f", enabled={enabled}" if enabled else ""
    code = f"with torch.autocast(device_type={setup.device_expr}, dtype=torch.{setup.dtype}{flag}):\n    pass\n"
    return lambda: cst.parse_statement(code)


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
            first = statements[0]
            statements[0] = first.with_changes(leading_lines=[*first.leading_lines, comment_line(header_comment)])
        return statements

    return edit


def _is_backward_of(line: cst.BaseStatement, name: str) -> bool:
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Expr)):
        return False
    call = line.body[0].value
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" \
        and isinstance(call.func.value, cst.Name) and call.func.value.value == name

