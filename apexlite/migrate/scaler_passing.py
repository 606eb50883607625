"""The edits that hand the GradScaler to the code amp.initialize's optimizers reach (apexlite.migrate.reach):
a keyword-only `scaler` parameter for each function that reads it, `scaler=scaler` at every call of
those functions, and the GradScaler imported beside an optimizer another file imports.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst

from apexlite.migrate.edits import Plan
from apexlite.migrate.reach import Key, Thread, Ties


def plan_threads(plans: Dict[Key, Plan], ties: Dict[Key, Ties], scalers: List[str], device: Optional[str]) -> None:
    """The GradScaler (and `device`, the variable holding a device type known only at run time) as
    keyword-only parameters of each function that needs them, passed by every call, and imported beside
    the optimizer where another file imports that and uses amp."""
    needed = _needed(plans, ties)
    importers = [key for key, file_ties in ties.items()
                 if file_ties.imported is not None and plans[key].analysis.uses]
    if not needed and not importers or not scalers and device is None:
        return
    if len(scalers) > 1:
        for thread in needed:
            plans[thread.key].todo(thread.function, f"this function would need the GradScalers {', '.join(scalers)} "
                                                    "passed in; migrate passes one: add them as parameters yourself")
        return
    names = [*scalers, *([device] if device is not None else [])]
    shown = " and ".join(f"`{name}=`" for name in names)
    what = " and ".join([*(["the GradScaler"] if scalers else []), *(["the device type"] if device else [])])
    them = "it" if len(names) == 1 else "them"
    for thread in needed:
        function = thread.function.name.value
        plans[thread.key].replace_expression(thread.function.params, _add_parameters(names))
        plans[thread.key].comment(thread.function, f"{function}() takes {what} that replaced amp ({shown}); every "
                                                   f"call migrate saw passes {them}")
        plans[thread.key].notes.append(f"{function}() now takes {what} as keyword-only {shown}: calls outside the "
                                       f"migrated files must pass {them} (they fail loudly until they do)")
        for call_key, call in thread.calls:
            plans[call_key].replace_expression(call, _add_arguments(names))
    for key in importers:
        plans[key].replace_small(ties[key].imported.statement, _add_imports(names))


def _needed(plans: Dict[Key, Plan], ties: Dict[Key, Ties]) -> List[Thread]:
    """The threaded functions that read the GradScaler: those with amp or an optimizer step in them, and
    those that call such a function."""
    threads = [thread for file_ties in ties.values() for thread in file_ties.threads.values()]
    needed: List[Thread] = []
    for thread in threads:
        analysis = plans[thread.key].analysis
        inside = [use.node for use in analysis.uses] + [
            call for call in analysis.walk(thread.function, cst.Call) if isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "step" and ties[thread.key].optimizer(call.func.value) is not None]
        if any(analysis.within(node, thread.function) for node in inside):
            needed.append(thread)
    changed = True
    while changed:
        changed = False
        for thread in threads:
            if thread in needed:
                continue
            analysis = plans[thread.key].analysis
            if any(key == thread.key and analysis.within(call, thread.function)
                   for other in needed for key, call in other.calls):
                needed.append(thread)
                changed = True
    return needed


def _add_parameters(names: List[str]):
    def edit(params: cst.Parameters) -> cst.Parameters:
        star = params.star_arg if isinstance(params.star_arg, cst.Param) else cst.ParamStar()
        added = [cst.Param(cst.Name(name)) for name in names]
        return params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, *added])

    return edit


def _add_arguments(names: List[str]):
    def edit(call: cst.Call) -> cst.Call:
        args = list(call.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        equal = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
        added = [cst.Arg(cst.Name(name), keyword=cst.Name(name), equal=equal) for name in names]
        return call.with_changes(args=[*args, *added])

    return edit


def _add_imports(names: List[str]):
    def edit(statement: cst.ImportFrom):
        aliases = list(statement.names)
        aliases[-1] = aliases[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return [statement.with_changes(names=[*aliases, *(cst.ImportAlias(cst.Name(name)) for name in names)])]

    return edit
