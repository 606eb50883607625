"""Functions of the script itself that a call runs, and the calls of each.

A training step often computes its loss in a helper (`loss = compute_loss(batch)`, whose body runs the
model): the autocast region must go around the call, where the forward runs, never around the `def`
(a `with` around a definition changes nothing when the function later runs). Only a name bound once, to
a `def`, is followed; anything else (a lambda, a rebound name, a method) is not.
"""
from __future__ import annotations

from typing import List, Optional

import libcst as cst

from apexlite.migrate.analysis import Analysis


def called_function(analysis: Analysis, call: cst.Call) -> Optional[cst.FunctionDef]:
    """The `def` in this file that `name(...)` runs, when `name` is bound once and to that `def`."""
    if not isinstance(call.func, cst.Name):
        return None
    scope = analysis.scope(call.func)
    bindings = list(scope[call.func.value]) if scope is not None else []
    if len(bindings) != 1:
        return None
    node = getattr(bindings[0], "node", None)
    return node if isinstance(node, cst.FunctionDef) else None


def calls_of(analysis: Analysis, function: cst.FunctionDef) -> Optional[List[cst.Call]]:
    """Every call of `function`, when its name is bound once and only ever called (not passed on, not
    stored, which could run it from anywhere); else None."""
    scope = analysis.scope(function)
    bindings = list(scope.assignments[function.name.value]) if scope is not None else []
    if len(bindings) != 1 or getattr(bindings[0], "node", None) is not function:
        return None
    calls = []
    for reference in bindings[0].references:
        parent = analysis.parent(reference.node)
        if not isinstance(parent, cst.Call) or parent.func is not reference.node:
            return None
        calls.append(parent)
    return calls
