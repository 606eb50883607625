"""`amp.initialize(...)`: what it sets up, and the native recipe that replaces it.

The call's options are resolved the way apexlite resolves them at run time (apexlite.amp.opt_levels:
the level's defaults, the user's overrides, bf16's loss scale of 1.0), so the migrated script does what
the original did under apexlite. The recipe it becomes is chosen in recipes.py; independently, each group
of loss ids gets one torch.amp.GradScaler for a dynamic or static loss scale other than 1.0.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional

import libcst as cst

from apexlite.amp.errors import AmpConfigError
from apexlite.amp.frontend import initialize as apexlite_initialize
from apexlite.amp.environment import parse_dtype
from apexlite.amp.opt_levels import OPT_LEVELS, resolve_properties
from apexlite.migrate import apis
from apexlite.migrate.analysis import ApexUse, dotted_text
from apexlite.migrate.class_ties import HomeClass, home_class
from apexlite.migrate.device import CPU, CUDA, RUNTIME, built_here
from apexlite.migrate.edits import Plan
from apexlite.migrate.guards import Guard, check_guard, enabled_code, model_touched_before, read_guard
from apexlite.migrate.level_switch import gate_runtime_o0, o0_switch
from apexlite.migrate.options import O2_APEXLITE, MigrateOptions
from apexlite.migrate.recipes import AUTOCAST, KEEP, NONE, O2_KEPT_REASON, Kept, choose_recipe
from apexlite.migrate.values import NOT_LITERAL, argparse_default, bind, elements, literal

_SIGNATURE = inspect.signature(apexlite_initialize).parameters
POSITIONAL = tuple(name for name, p in _SIGNATURE.items() if p.kind is p.POSITIONAL_OR_KEYWORD)
KEYWORD_ONLY = tuple(name for name, p in _SIGNATURE.items() if p.kind is p.KEYWORD_ONLY)
_LEVEL_OPTIONS = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights", "loss_scale")
_NO_NATIVE_OPTIONS = {
    "cast_model_outputs": "torch.autocast has no output cast: cast the model's outputs where they are used",
    "min_loss_scale": "torch.amp.GradScaler has no lower bound on its scale",
    "max_loss_scale": "torch.amp.GradScaler has no upper bound on its scale (apex capped it at 2**24)",
}


@dataclass
class AmpSetup:
    """One `amp.initialize` call and the recipe it becomes."""

    use: ApexUse
    call: cst.Call
    statement: cst.BaseSmallStatement
    models_arg: cst.BaseExpression
    optimizers_arg: Optional[cst.BaseExpression]
    model_nodes: List[cst.BaseExpression]  # the names the models have after the call
    optimizer_nodes: List[cst.BaseExpression]
    recipe: str
    level: str
    dtype: str  # "float16" / "bfloat16"
    loss_scale: Any  # "dynamic", a float, or 1.0 (no scaler)
    num_losses: int
    enabled: Optional[str]  # code of `enabled=` for autocast and GradScaler: the `if`s and enabled= flag
    device: str = CPU
    device_expr: str = '"cpu"'
    notes: List[str] = field(default_factory=list)
    guard: Guard = field(default_factory=Guard)  # the `if`s amp.initialize runs under
    anchor: Optional[cst.CSTNode] = None  # where migrate's comments about the call go
    flags: List[cst.BaseExpression] = field(default_factory=list)  # what `enabled` reads: the tests, enabled=
    scaler_names: List[str] = field(default_factory=list)  # the GradScalers the migration made
    kept_reason: str = ""  # KEEP: what torch has no recipe for
    home_class: Optional[HomeClass] = None  # amp.initialize on `self.` attributes in a method (class_ties.py)
    level_switched: bool = False  # `enabled` is the flag that switches opt_level between `level` and O0
    runtime_o0: str = ""  # what `enabled` reads, when it tests that the run-time opt level is not O0

    @property
    def scaled(self) -> bool:
        return self.recipe != KEEP and self.loss_scale != 1.0

    @property
    def models(self) -> List[str]:
        return [dotted_text(node) or "" for node in self.model_nodes]

    @property
    def optimizers(self) -> List[str]:
        return [dotted_text(node) or "" for node in self.optimizer_nodes]


def _chains(plan: Plan, node: Optional[cst.BaseExpression], what: str, at: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
    if node is None:
        return []
    items = elements(node)
    if items is None or any(dotted_text(item) is None for item in items):
        plan.todo(at, f"amp.initialize's {what} must be names (or a list of names) for migrate to follow them; "
                      "assign them to variables first")
        return None
    return items


def _targets(statement: cst.BaseSmallStatement, has_optimizers: bool, models: List[cst.BaseExpression],
             optimizers: List[cst.BaseExpression]) -> Optional[tuple]:
    """The names the models and optimizers are bound to by the call's assignment (the arguments' own
    names for a bare call); None when the assignment does not mirror the arguments."""
    if isinstance(statement, cst.Expr):
        return models, optimizers
    if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
        return None
    target = statement.targets[0].target
    parts = elements(target) if has_optimizers else [target]
    if parts is None or len(parts) != (2 if has_optimizers else 1):
        return None
    found = [elements(part) if isinstance(part, (cst.List, cst.Tuple)) else [part] for part in parts]
    found += [[]] * (2 - len(found))
    model_targets, optimizer_targets = found
    if has_optimizers and not optimizers and isinstance(parts[1], cst.Name):
        optimizer_targets = []  # `model, _ = amp.initialize(model, [], ...)`: no optimizer, a throwaway name
    if model_targets is None or optimizer_targets is None or len(model_targets) != len(models) \
            or len(optimizer_targets) != len(optimizers) \
            or any(dotted_text(item) is None for item in model_targets + optimizer_targets):
        return None
    return model_targets, optimizer_targets


def _level(plan: Plan, options: MigrateOptions, bound, call: cst.Call, anchor: cst.CSTNode) -> Optional[str]:
    """The opt level: the literal, or --opt-level for a run-time choice. Without --opt-level a TODO says so
    and the level the script defaults to (else O1) stands in, so the rest of the amp part is still read
    and every blocker is named in one run."""
    node = bound.value("opt_level")
    value = "O1" if node is None else literal(plan.analysis, node)
    if value is NOT_LITERAL:
        code = plan.analysis.code(node)
        if options.opt_level:
            if not (options.opt_level == "O2" and options.o2 == O2_APEXLITE):  # kept amp still reads it
                plan.notes.append(f"opt_level comes from `{code}` at run time; migrated for "
                                  f"{options.opt_level} (--opt-level)")
                plan.comment(anchor, f"migrated for opt_level {options.opt_level} (the script chose `{code}` at "
                                     "run time)")
            return options.opt_level
        found, default = _argparse_default(plan, node)
        stand_in = default if found and default in OPT_LEVELS else "O1"
        hint = f", whose argparse default is {default!r}" if found else ""
        plan.flags["--opt-level"] = stand_in
        plan.todo(call, f"opt_level is chosen at run time (`{code}`{hint}): run migrate again with --opt-level "
                        f"O0|O1|O2|O3, the level you train with (e.g. --opt-level {stand_in})")
        return stand_in
    if value not in OPT_LEVELS:
        plan.todo(call, f"opt_level={value!r} is not an opt level: write one of O0, O1, O2, O3 (the letter O)")
        return None
    if options.opt_level and options.opt_level != value:
        plan.notes.append(f"--opt-level {options.opt_level} not used: the script's amp.initialize picks opt_level "
                          f"{value} itself, which is what was migrated (--opt-level is for a level chosen at run time)")
    return value


def _argparse_default(plan: Plan, node: cst.BaseExpression):
    text = dotted_text(node)
    if text is None or "." not in text:
        return False, None
    return argparse_default(plan.analysis, text.rsplit(".", 1)[1])


def _resolved_options(plan: Plan, options: MigrateOptions, bound, call: cst.Call, level: str,
                      anchor: cst.CSTNode) -> dict:
    """The literal overrides of the call (with --loss-scale for a run-time loss_scale). A run-time choice
    migrate has no option for gets a TODO, and the level's default stands in."""
    overrides = {}
    for name in _LEVEL_OPTIONS + ("dtype",):
        node = bound.value(name)
        value = literal(plan.analysis, node)
        if value is NOT_LITERAL:
            code = plan.analysis.code(node)
            found, default = _argparse_default(plan, node)
            hint = f", whose argparse default is {default!r}" if found else ""
            if name == "loss_scale" and options.loss_scale is not None:
                plan.comment(anchor, f"migrated for loss_scale {options.loss_scale} (the script chose `{code}` at "
                                     "run time)")
                value = options.loss_scale
            elif name == "keep_batchnorm_fp32" and level in ("O0", "O1"):
                value = None  # no effect at these levels
            elif name == "loss_scale":
                stand_in = _loss_scale_stand_in(level, default if found else None)
                plan.flags["--loss-scale"] = stand_in
                plan.todo(call, f"loss_scale is chosen at run time (`{code}`{hint}): run migrate again with "
                                f"--loss-scale dynamic|N, the scale you train with (e.g. --loss-scale {stand_in})")
                value = None
            else:
                plan.todo(call, f"{name} is chosen at run time (`{code}`{hint}): write the value you train with "
                                f"as a literal ({name}=...) and run migrate again")
                value = None
        elif name == "loss_scale" and options.loss_scale is not None:
            picked = f"passes loss_scale={value!r}" if node is not None else f"leaves loss_scale to {level}'s default"
            plan.notes.append(f"--loss-scale {options.loss_scale} not used: the script's amp.initialize {picked}, "
                              "which is what was migrated (--loss-scale is for a scale chosen at run time)")
        overrides[name] = value
    return overrides


def _loss_scale_stand_in(level: str, default: Any) -> str:
    """What to suggest for --loss-scale: the script's argparse default, else the level's own default."""
    if default == "dynamic" or isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0:
        return str(default)
    if isinstance(default, str):
        try:
            if float(default) > 0:
                return default
        except ValueError:
            pass
    return "dynamic" if level in ("O1", "O2") else "1.0"


def read(plan: Plan, options: MigrateOptions, device: str) -> Optional[AmpSetup]:
    """The script's one `amp.initialize` call, or None (with TODOs saying why) when it cannot be read.

    A setup comes back even when TODOs were left (a run-time opt level, an `if` migrate cannot repeat):
    the planners still read the rest of the amp part with it, so one run names every blocker; the amp
    part's all-or-nothing rule then keeps none of its edits."""
    analysis = plan.analysis
    uses = analysis.uses_of(apis.INITIALIZE)
    if len(uses) > 1:
        for use in uses:
            plan.todo(use.node, f"amp.initialize has {len(uses)} call sites; migrate rewrites scripts with one: "
                                "make it one call (options chosen in the branches, say, then one amp.initialize "
                                "after them) and run migrate again, keep apexlite's amp (`from apexlite import "
                                "amp`), or migrate by hand")
        return None
    if not uses:
        return None
    use = uses[0]
    call = analysis.call_of(use)
    small = analysis.small_statement_of(use.node) if call is not None else None
    if call is None or not (isinstance(small, cst.Expr) and small.value is call or
                            isinstance(small, cst.Assign) and small.value is call):
        plan.todo(use.node, "amp.initialize is used other than as `models, optimizers = amp.initialize(...)`; "
                            "write it as that statement and run migrate again")
        return None
    bound = bind(call, POSITIONAL, KEYWORD_ONLY)
    if bound.error:
        plan.todo(call, f"amp.initialize cannot be read: {bound.error}; pass its arguments by name")
        return None
    models = _chains(plan, bound.value("models"), "models", call)
    optimizers = _chains(plan, bound.value("optimizers"), "optimizers", call)
    if models is None or optimizers is None:
        return None
    targets = _targets(small, bound.value("optimizers") is not None, models, optimizers)
    if targets is None:
        plan.todo(call, "the names amp.initialize's result is assigned to do not mirror its arguments; write "
                        "`model, optimizer = amp.initialize(model, optimizer, ...)`")
        return None
    guard = read_guard(analysis, small)
    anchor = guard.outermost or call
    switch = o0_switch(analysis, bound.value("opt_level"))
    level = switch[0] if switch is not None else _level(plan, options, bound, call, anchor)
    if level is None:
        return None
    if switch is not None and options.opt_level and options.opt_level != level:
        plan.notes.append(f"--opt-level {options.opt_level} not used: the script's opt_level is {level} when "
                          f"`{analysis.code(switch[1]).strip()}`, else O0, which is what was migrated")
    model_targets, optimizer_targets = targets
    if level == "O2" and options.o2 == O2_APEXLITE:  # amp stays; apexlite resolves the options at run time
        return AmpSetup(use, call, small, bound.value("models"), bound.value("optimizers"), list(model_targets),
                        list(optimizer_targets), KEEP, level, "float16", "dynamic", 1, None, guard=guard,
                        anchor=anchor, kept_reason=O2_KEPT_REASON)
    enabled_node = bound.value("enabled")
    if switch is not None:
        if enabled_node is not None:
            plan.todo(call, f"opt_level is {level} when `{analysis.code(switch[1]).strip()}` and O0 otherwise, and "
                            "enabled= is given too: combine them into one flag and run migrate again")
            return None
        enabled_node = switch[1]  # O0 is plain fp32: the flag turns mixed precision on, as enabled= would
    enabled = literal(analysis, enabled_node)
    flag_node = enabled_node if enabled is NOT_LITERAL else None
    runtime_source = ""
    if switch is None and enabled is not False:  # a run-time O0 is plain fp32 whatever level was migrated
        gated = gate_runtime_o0(plan, call, bound.value("opt_level"), level, guard.conditions, flag_node)
        if gated is None:
            return None
        flag_node, runtime_source = gated
    overrides = _resolved_options(plan, options, bound, call, level, anchor)
    dtype_value = overrides.pop("dtype")
    try:
        low_dtype = parse_dtype("float16" if dtype_value is None else dtype_value)
        if isinstance(overrides.get("cast_model_type"), str):
            import torch

            overrides["cast_model_type"] = getattr(torch, overrides["cast_model_type"])
        properties = resolve_properties(level, low_dtype, overrides)
    except AmpConfigError as error:
        plan.todo(call, f"amp.initialize would refuse these options: {error}")
        return None
    dtype = str(low_dtype).replace("torch.", "")
    recipe, loss_scale = choose_recipe(plan, properties, enabled, call, anchor)
    if recipe is None:
        return None
    if isinstance(recipe, Kept):  # amp stays: its guards and options work as they did
        return AmpSetup(use, call, small, bound.value("models"), bound.value("optimizers"), list(model_targets),
                        list(optimizer_targets), KEEP, level, dtype, "dynamic", 1, None, guard=guard, anchor=anchor,
                        kept_reason=recipe.reason)
    for name, why in _NO_NATIVE_OPTIONS.items():  # (amp kept on apexlite honours them all)
        if bound.value(name) is not None and literal(analysis, bound.value(name)) is not None:
            if name == "max_loss_scale" and literal(analysis, bound.value(name)) == 2.0 ** 24:
                continue
            plan.todo(call, f"{name} has no native equivalent: {why}")
    if guard.conditions or flag_node is not None:
        check_guard(plan, guard, call, small, flag_node)
    num_losses = literal(analysis, bound.value("num_losses")) if bound.value("num_losses") is not None else 1
    if loss_scale == 1.0 or recipe == NONE:
        num_losses = num_losses if isinstance(num_losses, int) and num_losses >= 1 else 1  # no scalers to share out
    elif not isinstance(num_losses, int) or num_losses < 1:
        plan.todo(call, "num_losses must be a literal whole number >= 1 for migrate to give each loss its scaler")
        return None
    flags = [condition.test for condition in guard.conditions] + ([flag_node] if flag_node is not None else [])
    setup = AmpSetup(use, call, small, bound.value("models"), bound.value("optimizers"), list(model_targets),
                     list(optimizer_targets), recipe, level,
                     "bfloat16" if recipe == AUTOCAST and properties.master_weights else dtype, loss_scale,
                     num_losses, enabled_code(analysis, guard.conditions, flag_node), guard=guard, anchor=anchor,
                     flags=flags, home_class=home_class(analysis, call, list(optimizer_targets)),
                     level_switched=switch is not None, runtime_o0=runtime_source)
    _choose_device(plan, setup, device)
    if setup.device == RUNTIME and guard.conditions and model_touched_before(analysis, guard, setup.call,
                                                                              setup.models):
        plan.todo(call, "the model is used inside `if` before amp.initialize, and its device is only known at "
                        "run time: migrate reads the device from the model before the `if`, where it may still "
                        "be elsewhere; move that code before the `if` and run migrate again")
    return setup


def _choose_device(plan: Plan, setup: AmpSetup, device: str) -> None:
    if device == CPU and not all(built_here(plan.analysis, model) for model in elements(setup.models_arg) or []):
        device = RUNTIME
    setup.device = device
    if device == RUNTIME:
        setup.device_expr = plan.fresh_name("amp_device_type")
        if setup.home_class is not None:  # the class's other methods read it too
            setup.device_expr = setup.home_class.attribute(setup.device_expr)
    else:
        setup.device_expr = f'"{CUDA if device == CUDA else CPU}"'
