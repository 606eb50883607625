"""Tests of whether apex is installed (`importlib.util.find_spec("apex")`, `import_module("apex.amp")`, ...) in a
script whose amp part migrate rewrites: the migrated script no longer imports apex, so where apex is missing such a
test would now turn mixed precision off (NVIDIA's TimeSeriesPredictionPlatform: `if not find_spec("apex"):
self.amp_enabled = False`). Each one is a TODO. A `try: import apex ... except ImportError:` guard is not one of
these: migrate rewrites those itself (applier.py)."""
from __future__ import annotations

import libcst as cst

from apexlite.migrate.analysis import dotted_text
from apexlite.migrate.edits import Plan

PROBES = ("find_spec", "find_loader", "import_module", "__import__", "get_loader")


def _names_apex(node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.SimpleString):
        return False
    name = node.evaluated_value
    return isinstance(name, str) and (name == "apex" or name.startswith("apex."))


def plan_apex_probes(plan: Plan) -> None:
    """A TODO at each call that looks apex up by its literal name."""
    for call in plan.analysis.nodes(cst.Call):
        function = (dotted_text(call.func) or "").rsplit(".", 1)[-1]
        if function in PROBES and call.args and call.args[0].keyword is None and _names_apex(call.args[0].value):
            plan.todo(call, f"`{plan.analysis.code(call)}` tests whether apex is installed, which the migrated "
                            "script no longer needs: where apex is missing this test would now turn mixed precision "
                            "off. Delete the test, or test what the migrated script uses now")
