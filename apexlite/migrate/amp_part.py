"""The apex.amp part of a script, migrated all or nothing.

A half-migrated amp (the scalers in, one scale_loss left) would train wrongly or not run, so the amp
planners work on a child plan: its edits are kept only when none of them left a TODO; otherwise the
amp code stays as it was, with the TODOs saying what to do. This module also rewrites the
`amp.initialize` statement itself (the scalers, the run-time device, O3's model cast) and the smaller amp
APIs.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional

import libcst as cst

from apexlite.migrate import apis
from apexlite.migrate.analysis import ApexUse
from apexlite.migrate.apex_probes import plan_apex_probes
from apexlite.migrate.clipping import plan_master_params, plan_other_clips
from apexlite.migrate.device import RUNTIME
from apexlite.migrate.custom_casts import plan_registration
from apexlite.migrate.edits import Plan, expression, small_statement
from apexlite.migrate.grad_reads import plan_grad_reads
from apexlite.migrate.initialize import AmpSetup, read
from apexlite.migrate.recipes import AUTOCAST, HALF, KEEP, NONE
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.proof import unproven
from apexlite.migrate.import_ties import Key, Resolver
from apexlite.migrate.reach import Unit, link
from apexlite.migrate.scale_loss import ScaleLossPlanner
from apexlite.migrate.scaler_passing import plan_threads
from apexlite.migrate.state_dicts import plan_state

DISABLE_CASTS = "apex.amp.handle.disable_casts"
_CUSTOM_CASTS = ("torch.autocast has its own op lists: cast inside the function, or decorate it with "
                 "torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float16)")
NATIVE_HINTS = {
    "apex.amp.amp.register_half_function": _CUSTOM_CASTS,
    "apex.amp.amp.register_float_function": _CUSTOM_CASTS.replace("float16", "float32"),
    "apex.amp.amp.register_promote_function": "torch.autocast promotes mixed inputs of its own promote list; "
                                              "cast the inputs to one dtype inside the function",
    "apex.amp.amp.half_function": _CUSTOM_CASTS,
    "apex.amp.amp.float_function": _CUSTOM_CASTS.replace("float16", "float32"),
    "apex.amp.amp.promote_function": "cast the inputs to one dtype inside the function",
    "apex.amp.amp.init": "the pre-2019 handle API: use torch.autocast and torch.amp.GradScaler",
}


def is_amp(use: ApexUse) -> bool:
    return use.api == apis.AMP_MODULE or use.api.startswith(apis.AMP_MODULE + ".")


def plan_amp_files(plans: Dict[Key, Plan], home: Optional[Key], options: MigrateOptions, device: str,
                   refused: Optional[str] = None, resolve: Resolver = lambda key, node: None,
                   shown: Callable[[Key], str] = str, elsewhere: str = "") -> Optional[AmpSetup]:
    """Plan the amp part of files migrated together (`home`: the one with amp.initialize), all or nothing
    across them: each file's edits are kept only when no file's amp part left a TODO. `shown`: a file's
    name in messages; `elsewhere`: the amp.initialize calls of other files, when they are several."""
    uses = {key: [use for use in plan.analysis.uses if is_amp(use)] for key, plan in plans.items()}
    if not any(uses.values()):
        return None
    children = {key: plan.child() for key, plan in plans.items()}
    setup = read(children[home], options, device) if home is not None else None
    if setup is None:
        if not any(child.todos for child in children.values()):
            for key, file_uses in uses.items():
                _plan_without_setup(children[key], file_uses, elsewhere)
    else:
        ties = link({key: plan.analysis for key, plan in plans.items()}, home, setup.call, setup.optimizer_nodes,
                    setup.model_nodes, resolve, setup.home_class)
        units = [Unit(key, children[key], ties[key], key == home) for key in plans]
        origin = f"{shown(home)}:{setup.use.line}" if len(plans) > 1 else ""
        if setup.recipe == KEEP:
            for unit in units:
                _plan_keep(unit, setup, uses[unit.key])
        else:
            _plan_native(units, setup, uses, origin)
        for unit in units:
            plan_apex_probes(unit.plan)
        if refused is not None:
            children[home].todo(setup.call, refused)
    migrated = setup is not None and not any(child.todos for child in children.values())
    if setup is not None and not migrated:
        _name_the_other_files(children, uses, shown)
    for key, plan in plans.items():
        for use in uses[key]:
            children[key].handle(use.node)
        plan.merge(children[key], keep_edits=migrated)
    return setup if migrated else None


def _plan_native(units: List[Unit], setup: AmpSetup, uses: Dict[Key, List[ApexUse]], origin: str) -> None:
    planner = ScaleLossPlanner(units, setup, origin)
    planner.plan_all()
    setup.scaler_names = [scaler.name for scaler in planner.scalers]
    missing = unproven(units, setup, len(planner.sites))
    if missing is not None:
        next(unit for unit in units if unit.home).plan.todo(setup.call, missing)
    for unit in units:
        plan_master_params(unit, setup, planner)
        plan_other_clips(unit, setup, planner)
        plan_grad_reads(unit, planner)
        plan_state(unit, setup, planner)
        _plan_other(unit, setup, uses[unit.key])
    home = next(unit for unit in units if unit.home)
    _plan_initialize_statement(home.plan, setup, planner)
    device = setup.device_expr if setup.device == RUNTIME and _needs_device(setup, uses) else None
    plan_threads({unit.key: unit.plan for unit in units}, {unit.key: unit.ties for unit in units},
                 [scaler.name for scaler in planner.scalers], device)


def _needs_device(setup: AmpSetup, uses: Dict[Key, List[ApexUse]]) -> bool:
    """Whether the code amp reaches needs the device type: autocast regions, or amp.disable_casts()."""
    return setup.recipe == AUTOCAST or any(use.api == DISABLE_CASTS for file_uses in uses.values()
                                           for use in file_uses)


def _plan_without_setup(plan: Plan, amp_uses: List[ApexUse], elsewhere: str) -> None:
    missing = ("amp.initialize is not in this file (nor in a file migrated with it), so migrate cannot tell what "
               "this amp call becomes; migrate it together with the file that calls amp.initialize, or keep "
               "apexlite's amp")
    if elsewhere:
        missing = (f"amp.initialize is called more than once ({elsewhere}) in the programs this file is part of "
                   "(the files that import it, and what they import), so migrate cannot tell which setup this amp "
                   "call belongs to: migrate the amp part by hand, or keep apexlite's amp")
    for use in amp_uses:
        hint = NATIVE_HINTS.get(use.api)
        plan.todo(use.node, f"`{plan.analysis.code(use.node)}` has no certain torch rewrite: {hint}" if hint
                  else missing)


def _name_the_other_files(children: Dict[Key, Plan], uses: Dict[Key, List[ApexUse]],
                          shown: Callable[[Key], str]) -> None:
    """All or nothing across files: a file whose own amp part was fine says which other file holds it back."""
    blocked = [(shown(key), min(todo.line for todo in child.todos)) for key, child in children.items() if child.todos]
    for key, child in children.items():
        if child.todos or not uses[key]:
            continue
        where = ", ".join(f"{other}:{line}" for other, line in blocked)
        node = next((use.node for use in uses[key] if use.api == apis.INITIALIZE), uses[key][0].node)
        child.todo(node, f"amp here is migrated together with {where} (one GradScaler for both files, all or "
                         "nothing): do what the TODO there says, then run migrate on both files again")


def _plan_keep(unit: Unit, setup: AmpSetup, amp_uses: List[ApexUse]) -> None:
    """O2 (and O3 in fp32 batchnorm or with an fp16 loss scale) stays on apexlite's amp: only the import changes
    (imports.py), if every use is one apexlite.amp has."""
    plan = unit.plan
    if unit.home:  # the report says why the file is kept on apexlite (report.kept_reason)
        plan.comment(setup.call, f"amp stays on apexlite: {setup.kept_reason}")
    for use in amp_uses:
        if use.bound == apis.AMP_MODULE:
            first = use.written[len(apis.AMP_MODULE) + 1:].split(".")[0]
        elif use.bound.startswith(apis.AMP_MODULE + ".") and "." not in use.bound[len(apis.AMP_MODULE) + 1:]:
            first = use.bound[len(apis.AMP_MODULE) + 1:]
        else:
            first = None
        spelled = use.written.split(".")
        if first is None and spelled[:2] == ["apex", "amp"] and len(spelled) > 2 \
                and spelled[2] in apis.apexlite_amp_names():
            plan.todo(use.node, f"`{plan.analysis.code(use.node)}` reaches amp through the apex package, which the "
                                f"kept script no longer imports: import amp as `from apexlite import amp` and write "
                                f"`amp.{'.'.join(spelled[2:])}` (apexlite.amp has `{spelled[2]}`)")
        elif first is None or (first and first not in apis.apexlite_amp_names()):
            plan.todo(use.node, f"`{plan.analysis.code(use.node)}` is not part of apexlite.amp's API; import amp as "
                                "`from apexlite import amp` and use amp's public functions")


def _plan_other(unit: Unit, setup: AmpSetup, amp_uses: List[ApexUse]) -> None:
    plan = unit.plan
    for use in amp_uses:
        if plan.is_handled(use.node) or use.api == apis.INITIALIZE:
            continue
        call = plan.analysis.call_of(use)
        if use.api == DISABLE_CASTS and call is not None and not call.args and setup.device == RUNTIME \
                and not unit.ties.reaches_scaler(call):
            plan.todo(call, f"amp.disable_casts() becomes torch.autocast(device_type=..., enabled=False), and the "
                            f"device type is only known next to amp.initialize ({setup.device_expr}); pass it in "
                            "and run migrate again")
            continue
        if use.api == DISABLE_CASTS and call is not None and not call.args:
            code = f"torch.autocast(device_type={setup.device_expr}, enabled=False)"
            plan.replace_expression(call, lambda _: expression(code))
            plan.needs_torch = True
            continue
        if plan_registration(plan, use.api, call, setup.device):
            continue
        hint = NATIVE_HINTS.get(use.api) or _hint_from_context(plan, use) or (
            "it is amp's own machinery: write what it did with torch.autocast and the torch.amp.GradScaler "
            "(scaler.get_scale(), scaler.unscale_(optimizer), ...), or keep apexlite's amp (`from apexlite import amp`)")
        plan.todo(use.node, f"`{plan.analysis.code(use.node)}` has no certain torch rewrite: {hint}")


def _hint_from_context(plan: Plan, use: ApexUse) -> Optional[str]:
    """What to do with a use of amp itself that no rule rewrites, where its form says (apex's op lists; a test
    that apex imported)."""
    if use.api.startswith(apis.AMP_MODULE + ".lists"):
        return ("it edits apex's O1 op lists, which torch.autocast does not read (it has its own, with no "
                "override): where the script moved an op to another precision (softmax to float16, say), cast that "
                "op's inputs where it is called, or leave the edit out and accept torch.autocast's choice")
    if use.api == apis.AMP_MODULE:
        parent = plan.analysis.parent(use.node)
        if isinstance(parent, cst.Comparison) and all(isinstance(target.operator, (cst.Is, cst.IsNot))
                                                      for target in parent.comparisons):
            return "it only tests whether apex imported, and the migrated script does not import it: delete the test"
    return None


def _normalised(code: str) -> str:
    return re.sub(r"\s+", "", code).strip("()")


def _plan_initialize_statement(plan: Plan, setup: AmpSetup, planner: ScaleLossPlanner) -> None:
    """The call becomes the recipe's statements. Under `if flag:` the device and the GradScalers (which
    every path reads) go above the outermost `if`, with `enabled=` saying when amp ran; what only the
    flagged path does (O3's casts) stays inside."""
    analysis = plan.analysis
    value_code = analysis.code(setup.models_arg) + (
        f", {analysis.code(setup.optimizers_arg)}" if setup.optimizers_arg is not None else "")
    keep_assignment = isinstance(setup.statement, cst.Assign) and _normalised(
        analysis.code(setup.statement.targets[0].target)) != _normalised(value_code)
    every_path: List[str] = []
    in_place: List[str] = []
    needs_device = setup.recipe == AUTOCAST or planner.scalers or any(
        use.api == DISABLE_CASTS for use in analysis.uses)
    if setup.device == RUNTIME and needs_device:
        every_path.append(f"{setup.device_expr} = next({setup.models[0]}.parameters()).device.type")
    if setup.recipe == HALF:
        cast = "half()" if setup.dtype == "float16" else "to(torch.bfloat16)"
        for model in setup.models:
            in_place.append(f"{model}.{cast}")
            # apex's O3 cast every floating tensor in the inputs (keywords and nested containers too) and in the
            # output, however nested: torch's pytree walks tuples, lists, dicts and namedtuples the same way
            in_place.append(f"{model}.register_forward_pre_hook(\n    lambda module, args, kwargs: "
                            f"torch.utils._pytree.tree_map(lambda a: a.{cast} if torch.is_tensor(a) and "
                            "a.is_floating_point() else a, (args, kwargs)), with_kwargs=True)")
            in_place.append(f"{model}.register_forward_hook(\n    lambda module, args, output: "
                            "torch.utils._pytree.tree_map(lambda a: a.float() if torch.is_tensor(a) and "
                            "a.is_floating_point() else a, output))")
    enabled = f", enabled={setup.enabled}" if setup.enabled else ""
    static = "" if setup.loss_scale == "dynamic" else f", init_scale={float(setup.loss_scale)!r}, growth_interval=2**31 - 1"
    for scaler in planner.scalers:
        every_path.append(f"{scaler.name} = torch.amp.GradScaler({setup.device_expr}{static}{enabled})")
    plan.comment(setup.anchor, _summary(setup, planner))
    if static and planner.scalers:
        plan.comment(setup.anchor, f"apex's static loss_scale={setup.loss_scale!r}: GradScaler has no static mode, "
                                   "so its growth is disabled; unlike apex, an overflowing step is skipped and "
                                   "halves it")
    if setup.recipe == HALF:
        plan.comment(setup.anchor, f"O3 traps: no fp32 master weights (updates below {setup.dtype}'s resolution "
                                   f"are lost), batchnorm and optimizer state in {setup.dtype} (the model's inputs "
                                   "are cast in and its outputs back to float32 by the hooks below, as apex did); "
                                   "torch.autocast (O1) is the safer recipe")
    if setup.guard.outermost is not None:
        plan.insert_before(setup.guard.outermost, every_path)
    else:
        in_place = every_path + in_place
    plan.needs_torch = plan.needs_torch or bool(every_path or in_place)
    value = expression(value_code) if keep_assignment else None

    def edit(updated: cst.BaseSmallStatement):
        kept = [updated.with_changes(value=value)] if value is not None else []
        return kept + [small_statement(line) for line in in_place]

    plan.replace_small(setup.statement, edit)


def _summary(setup: AmpSetup, planner: ScaleLossPlanner) -> str:
    scalers = ", ".join(scaler.name for scaler in planner.scalers)
    scaling = f" and torch.amp.GradScaler ({scalers})" if scalers else ""
    what = {
        AUTOCAST: f"torch.autocast({setup.dtype}) around the forward pass and the loss{scaling}",
        HALF: f"the model cast to {setup.dtype} (pure low-precision training){scaling}",
        NONE: f"plain fp32 training{scaling}",
    }[setup.recipe]
    if setup.guard.conditions and (scalers or setup.recipe == AUTOCAST):
        return (f"amp.initialize (opt_level {setup.level}) ran only when `{setup.enabled}`: it became {what}, "
                "on every path, enabled by that flag")
    if setup.enabled and (scalers or setup.recipe == AUTOCAST):
        source = f"its opt_level is {setup.level} then, O0 otherwise" if setup.level_switched else "its enabled="
        source = setup.runtime_o0 or source
        return f"amp.initialize (opt_level {setup.level}) became {what}, enabled when `{setup.enabled}` ({source})"
    return f"amp.initialize (opt_level {setup.level}) became {what}"
