"""Which `if` conditions mean "amp is on" in a migrated script: the conditions amp.initialize ran under, and the
parameters every caller passes that same flag to. A GradScaler is enabled exactly where amp.initialize ran, so a
scale_loss (or an unscaled backward beside it) is exact only under one of these."""
from __future__ import annotations

from typing import List, Set

import libcst as cst

from apexlite.migrate.guards import Condition, key, read_guard, resolves_alike
from apexlite.migrate.initialize import AmpSetup
from apexlite.migrate.reach import Unit, argument_for

MAX_PASSES = 4  # calls a flag may travel through, parameter to parameter


class FlagGuards:
    """The amp-on conditions of one amp setup, read in any of its files (`units`)."""

    def __init__(self, units: List[Unit], setup: AmpSetup) -> None:
        self.units = units
        self.setup = setup

    def ran_under(self, analysis) -> Set[str]:
        """The keys of the conditions amp.initialize ran under (its `if`s and its enabled= flag)."""
        ran_under = {key(analysis, test, True) for test in self.setup.flags[len(self.setup.guard.conditions):]}
        return ran_under | {condition.key(analysis) for condition in self.setup.guard.conditions}

    def means_amp_on(self, unit: Unit, condition: Condition) -> bool:
        """Whether `condition` holds exactly where amp.initialize ran."""
        ran_under = self.ran_under(unit.analysis)
        return condition.key(unit.analysis) in ran_under or self._passed_flag(unit, condition, ran_under)

    def scaled_or_amp_off(self, unit: Unit, call: cst.Call) -> bool:
        """Whether a `.backward()` call is scaled (inside amp.scale_loss) or runs only where amp.initialize
        did not (the `else` of its flag)."""
        analysis = unit.analysis
        if any(isinstance(node, cst.With) and any("scale_loss" in analysis.code(item.item) for item in node.items)
               for node in analysis.ancestors(call)):
            return True
        for condition in read_guard(analysis, call).conditions:
            opposite = Condition(condition.test, not condition.positive, condition.owner)  # where it does not run
            if self.means_amp_on(unit, opposite):
                return True
        return False

    def _passed_flag(self, unit: Unit, condition: Condition, ran_under: Set[str], depth: int = 0) -> bool:
        """Whether `condition` tests a parameter every call of its function passes amp.initialize's own flag
        to (`train(..., fp16=args.fp16)` with `if args.fp16: amp.initialize(...)`), meaning there what it
        means at amp.initialize; or passes such a parameter on, up to MAX_PASSES calls deep."""
        if depth >= MAX_PASSES:
            return False
        test, positive = condition.test, condition.positive
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, positive = test.expression, not positive
        if not isinstance(test, cst.Name):
            return False
        function = unit.analysis.parameter_owner(test)
        calls = unit.ties.calls_of(function) if function is not None else None
        if calls is None:
            return False
        for call_key, call in calls:
            caller = next((other for other in self.units if other.key == call_key), None)
            argument = argument_for(function, call, test.value) if caller is not None else None
            if argument is None:
                return False
            if caller.home and key(caller.analysis, argument, positive) in ran_under \
                    and resolves_alike(caller.analysis, self.setup.flags, call):
                continue
            passed_on = Condition(argument, positive, condition.owner)  # `train_batch(..., fp16)` inside `train`
            if not self._passed_flag(caller, passed_on, self.ran_under(caller.analysis), depth + 1):
                return False
        return True
