"""Where `torch.autocast` goes: around the forward pass and the loss computation, nothing more.

For each scaled loss, the region ends at the statement that computes the loss and starts at the
earliest statement the loss depends on (by the names it reads, followed backwards through the block)
that runs one of amp's models, back to the last backward or step before it; a forward the loss depends
on that runs before that backward (a GAN's generator, whose output the discriminator's losses use
first) gets a region of its own. At O1 the forwards of other modules count too (a distillation teacher amp
never saw: apex's O1 patched torch's functions, so they ran in low precision as well). Data loading before the forward and the optimizer work after the loss
stay outside, as in torch's AMP examples. Statements that step an optimizer, scale a loss or call
`amp.initialize` are never inside a region. Regions of one block that overlap or touch are merged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from apexlite.migrate import local_functions
from apexlite.migrate.analysis import Analysis
from apexlite.migrate.edits import Plan
from apexlite.migrate.reach import argument_for

# the calls of a function when migrate sees every one of them in this file, else None
Callers = Callable[[cst.FunctionDef], Optional[List[cst.Call]]]


@dataclass
class Region:
    block: cst.CSTNode
    start: int
    end: int  # inclusive indices into block.body


class RegionFinder:
    """Finds the autocast region of each scaled loss; `regions` holds them, merged per block."""

    def __init__(self, plan: Plan, models: Sequence[str], markers: Sequence[cst.CSTNode],
                 others: Sequence[str] = (), callers: Callers = lambda function: None) -> None:
        self.plan = plan
        self.callers = callers
        self.analysis: Analysis = plan.analysis
        self.models = set(models)
        # what holds a model given as a submodule (`model` of `model.top_model`, DLRM's): calling it runs that model
        self.owners = {model.rsplit(".", depth)[0] for model in self.models
                       for depth in range(1, model.count(".") + 1)} - self.models - {"self"}
        self.others = set(others) - self.models  # modules amp was not given whose forwards it cast (O1)
        self.marked: Set[int] = set()
        self.markers = {id(node) for node in markers}
        for node in markers:
            self.marked.update(id(ancestor) for ancestor in self.analysis.ancestors(node))
            self.marked.add(id(node))
        self.regions: List[Region] = []

    def _is_marker(self, statement: cst.CSTNode) -> bool:
        return id(statement) in self.marked

    def _runs_model(self, statement: cst.CSTNode, seen: Tuple[int, ...] = ()) -> bool:
        """Whether running `statement` runs a model's forward: directly, or in a helper of this file it calls
        (`loss = compute_loss(batch)`). A `def` or `class` runs nothing by being defined."""
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            return False
        if self.analysis.dotted_uses(statement) & self.models:
            return True
        for call in self.analysis.walk(statement, cst.Call):
            if self._calls_other(call):
                return True
            helper = local_functions.called_function(self.analysis, call)
            if helper is not None and id(helper) not in seen and len(seen) < 8 and \
                    any(self._runs_model(inner, (*seen, id(helper))) for inner in helper.body.body):
                return True
        return False

    def _calls_other(self, call: cst.Call) -> bool:
        callee = self.analysis.code(call.func)
        return callee in self.owners or bool(self.others) and callee in self.others

    def _loss_statement(self, start: cst.BaseStatement, names: Set[str]) -> Optional[cst.BaseStatement]:
        """The nearest statement before `start` (in its block, then in the enclosing blocks up to the function)
        that assigns one of `names`; earlier backward passes and steps may lie between (a GAN computes both
        losses from one forward pass, then steps each optimizer in turn)."""
        statement = start
        while True:
            block = self.analysis.block_of(statement)
            body = list(block.body)
            for candidate in reversed(body[:body.index(statement)]):
                if self.analysis.assigned_names(candidate) & names:
                    return candidate
            if isinstance(block, cst.Module):
                return None
            owner = self.analysis.parent(block)
            while owner is not None and not isinstance(owner, cst.BaseCompoundStatement):
                owner = self.analysis.parent(owner)
            if owner is None or isinstance(owner, (cst.FunctionDef, cst.ClassDef)):
                return None
            statement = self.analysis.statement_of(owner)  # (an `elif` is its chain's first `if`)

    def _passed_in(self, loss: cst.BaseExpression) -> Optional[List[Tuple[cst.Call, cst.BaseExpression]]]:
        """Where a loss that is a parameter of its function (`def backward(loss, optimizer)`) comes from: each
        call of the function with the argument it passes; None unless migrate sees every call."""
        if not isinstance(loss, cst.Name):
            return None
        function = self.analysis.parameter_owner(loss)
        calls = self.callers(function) if isinstance(function, cst.FunctionDef) else None
        if not calls:
            return None
        passed = [(call, argument_for(function, call, loss.value)) for call in calls]
        return None if any(argument is None for _, argument in passed) else passed

    def find(self, scaled: cst.BaseStatement, loss: cst.BaseExpression, via: str = "amp.scale_loss",
             depth: int = 0) -> bool:
        """Record the region of the loss scaled at `scaled` (or handed to a helper that scales it, `via`);
        False (with a TODO) when there is none."""
        if any(isinstance(node, (cst.Call, cst.Lambda, cst.NamedExpr)) for node in _descendants(loss)):
            self.plan.todo(scaled, f"the loss passed to {via} is computed in the call; compute it into a "
                                   "variable under torch.autocast first")
            return False
        passed = self._passed_in(loss) if depth < 8 and self._loss_statement(
            scaled, self.analysis.loaded_names(loss)) is None else None
        if passed is not None:  # a backward helper: the forward is in its callers
            results = [self.find(self.analysis.statement_of(call), argument, f"{self.analysis.code(call.func)}()",
                                 depth + 1) for call, argument in passed]
            return all(results)
        return self._find_from(scaled, scaled, self.analysis.loaded_names(loss), via, depth)

    def _find_from(self, scaled: cst.BaseStatement, anchor: cst.BaseStatement, names: Set[str], via: str,
                   depth: int, climbed: bool = False) -> bool:
        """The region of a loss read through `names` before `anchor`; a loss only rescaled in a nested block
        (`loss = loss / accumulation_steps` under an `if`) is followed out to the forward that computed it."""
        loss_statement = self._loss_statement(anchor, names)
        if loss_statement is None:
            self.plan.todo(scaled, f"migrate did not find where this loss is computed before {via}; put "
                                   "the forward pass and the loss computation under torch.autocast yourself")
            return False
        block = self.analysis.block_of(loss_statement)
        body = list(block.body)
        end = body.index(loss_statement)
        depends = self._reads(loss_statement)
        starts = [end] if self._runs_model(loss_statement) else []
        earlier: List[int] = []  # forwards the loss depends on that run before an earlier backward or step
        after_earlier_backward = False
        for index in range(end - 1, -1, -1):
            statement = body[index]
            if self._is_marker(statement):
                after_earlier_backward = True
                continue
            assigned = self.analysis.assigned_names(statement)
            if assigned & depends:
                depends |= self._reads(statement)
                if not self._runs_model(statement):
                    continue
                if not after_earlier_backward:
                    starts.append(index)
                elif not assigned & self.models:  # not the model's own construction or amp.initialize
                    earlier.append(index)
        if not starts and after_earlier_backward and not climbed:
            starts = [end]  # a second loss from an earlier forward pass (under its own region, below)
        if not starts and depth < 8 and not isinstance(block, cst.Module) and \
                self._loss_statement(loss_statement, depends) is not None:
            return self._find_from(scaled, loss_statement, depends, via, depth + 1, climbed=True)
        if not starts:
            self.plan.todo(scaled, f"no forward pass of {', '.join(sorted(self.models))} found where this loss is "
                                   "computed; put the forward pass and the loss under torch.autocast yourself")
            return False
        self._add(Region(block, min(starts), end), scaled)
        for index in earlier:  # a GAN's generator output, made before the discriminator's backward
            self._add(Region(block, index, index), scaled)
        return True

    def _reads(self, statement: cst.CSTNode) -> Set[str]:
        """The names `statement` reads, with the targets of its augmented assignments (`loss /= steps` reads
        the loss it divides)."""
        names = self.analysis.loaded_names(statement)
        for augmented in self.analysis.walk(statement, cst.AugAssign):
            names |= {name.value for name in self.analysis.walk(augmented.target, cst.Name)}
        return names

    def _add(self, region: Region, scaled: cst.BaseStatement) -> None:
        for existing in self.regions:
            if existing.block is region.block and region.start <= existing.end + 1 and existing.start <= region.end + 1:
                existing.start, existing.end = min(existing.start, region.start), max(existing.end, region.end)
                return
        self.regions.append(region)

    def forwards_outside(self) -> List[cst.Call]:
        """Calls of amp's models (`model(x)`) in no region: evaluation, inference, a forward no scaled loss reads.
        apex's O1 ran them in float16 too; after the migration they run in float32 (the caller says so)."""
        covered: Set[int] = set()
        for region in self.regions:
            for statement in list(region.block.body)[region.start:region.end + 1]:
                covered.update(id(node) for node in self.analysis.walk(statement, cst.CSTNode))
        return [call for call in self.analysis.nodes(cst.Call)
                if (self.analysis.code(call.func) in self.models or self._calls_other(call))
                and not self._runs_covered(call, covered, ())]

    def _runs_covered(self, node: cst.CSTNode, covered: Set[int], seen: Tuple[int, ...]) -> bool:
        """Whether `node` runs under a region, a marker or the script's own precision: itself, or the helper
        holding it, when migrate sees every call of that helper and each one runs so."""
        if id(node) in covered or any(id(a) in self.markers or self._sets_precision(a)
                                      for a in self.analysis.ancestors(node)):
            return True
        helper = self.analysis.enclosing_scope_owner(node)
        if not isinstance(helper, cst.FunctionDef) or id(helper) in seen or len(seen) >= 8:
            return False
        calls = local_functions.calls_of(self.analysis, helper)
        return bool(calls) and all(self._runs_covered(call, covered, (*seen, id(helper))) for call in calls)

    def _sets_precision(self, node: cst.CSTNode) -> bool:
        """A `with` that already decides the precision inside it (amp.disable_casts(), the script's own autocast)."""
        return isinstance(node, cst.With) and any(
            name in self.analysis.code(item.item) for item in node.items for name in ("disable_casts", "autocast"))

    def by_block(self) -> Dict[int, List[Region]]:
        grouped: Dict[int, List[Region]] = {}
        for region in self.regions:
            grouped.setdefault(id(region.block), []).append(region)
        return grouped


# methods only a torch.nn.Module has among what scripts call: the evidence that a name holds a model
MODULE_METHODS = frozenset({"eval", "train", "parameters", "named_parameters", "modules", "children",
                            "buffers", "requires_grad_"})


def modules_in(analysis: Analysis) -> Set[str]:
    """The names (`teacher`, `self.teacher`) a script calls a Module-only method of (`teacher.eval()`)."""
    return {analysis.code(call.func.value) for call in analysis.nodes(cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in MODULE_METHODS
            and analysis.code(call.func.value) != "self"}


def _descendants(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.children)
