"""`amp.initialize(...)`: what it sets up, and the native recipe that replaces it.

The call's options are resolved the way apexlite resolves them at run time (apexlite.amp.opt_levels:
the level's defaults, the user's overrides, bf16's loss scale of 1.0), so the migrated script does what
the original did under apexlite. The recipe:
  - AUTOCAST (O1; O2 with --o2=bf16-autocast): torch.autocast around the forward and loss;
  - HALF (O3): the model cast to fp16/bf16, its floating inputs cast by a forward pre-hook, as apex did;
  - NONE (O0, enabled=False): plain fp32 training;
  - KEEP (O2 by default): torch has no fp32-master-weights recipe, so the script keeps amp, imported
    from apexlite by its real package name;
and, independently, one torch.amp.GradScaler per group of loss ids for a dynamic or static loss scale
other than 1.0.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, List, Optional

import libcst as cst

from apexlite.amp.errors import AmpConfigError
from apexlite.amp.frontend import initialize as apexlite_initialize
from apexlite.amp.frontend import parse_dtype
from apexlite.amp.opt_levels import OPT_LEVELS, resolve_properties
from apexlite.migrate import apis
from apexlite.migrate.analysis import ApexUse, dotted_text
from apexlite.migrate.device import CPU, CUDA, RUNTIME
from apexlite.migrate.edits import Plan
from apexlite.migrate.options import O2_APEXLITE, MigrateOptions
from apexlite.migrate.values import NOT_LITERAL, bind, elements, literal

AUTOCAST, HALF, NONE, KEEP = "autocast", "half", "none", "keep"
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
    enabled: Optional[str]  # code of a run-time `enabled=` flag, passed on to autocast and GradScaler
    device: str = CPU
    device_expr: str = '"cpu"'
    notes: List[str] = field(default_factory=list)

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
    if model_targets is None or optimizer_targets is None or len(model_targets) != len(models) \
            or len(optimizer_targets) != len(optimizers) \
            or any(dotted_text(item) is None for item in model_targets + optimizer_targets):
        return None
    return model_targets, optimizer_targets


def _level(plan: Plan, options: MigrateOptions, bound, call: cst.Call) -> Optional[str]:
    node = bound.value("opt_level")
    value = "O1" if node is None else literal(plan.analysis, node)
    if value is NOT_LITERAL:
        if options.opt_level:
            if not (options.opt_level == "O2" and options.o2 == O2_APEXLITE):  # kept amp still reads it
                plan.notes.append(f"opt_level comes from `{plan.analysis.code(node)}` at run time; migrated for "
                                  f"{options.opt_level} (--opt-level)")
                plan.comment(call, f"migrated for opt_level {options.opt_level} (the script chose "
                                   f"`{plan.analysis.code(node)}` at run time)")
            return options.opt_level
        hint = _argparse_hint(plan, node)
        plan.todo(call, f"opt_level is chosen at run time (`{plan.analysis.code(node)}`{hint}); run migrate with "
                        "--opt-level O0|O1|O2|O3 for the level you train with")
        return None
    if value not in OPT_LEVELS:
        plan.todo(call, f"opt_level={value!r} is not an opt level (O0, O1, O2, O3; the letter O)")
        return None
    return value


def _argparse_hint(plan: Plan, node: cst.BaseExpression) -> str:
    from apexlite.migrate.values import argparse_default

    text = dotted_text(node)
    if text is None or "." not in text:
        return ""
    found, default = argparse_default(plan.analysis, text.rsplit(".", 1)[1])
    return f", whose argparse default is {default!r}" if found else ""


def _resolved_options(plan: Plan, options: MigrateOptions, bound, call: cst.Call, level: str) -> Optional[dict]:
    """The literal overrides of the call (with --loss-scale for a run-time loss_scale)."""
    overrides = {}
    for name in _LEVEL_OPTIONS + ("dtype",):
        node = bound.value(name)
        value = literal(plan.analysis, node)
        if value is NOT_LITERAL:
            if name == "loss_scale" and options.loss_scale is not None:
                plan.comment(call, f"migrated for loss_scale {options.loss_scale} (the script chose "
                                   f"`{plan.analysis.code(node)}` at run time)")
                value = options.loss_scale
            elif name == "keep_batchnorm_fp32" and level in ("O0", "O1"):
                value = None  # no effect at these levels
            else:
                hint = _argparse_hint(plan, node)
                extra = " (or --loss-scale dynamic|N)" if name == "loss_scale" else ""
                plan.todo(call, f"{name} is chosen at run time (`{plan.analysis.code(node)}`{hint}); migrate needs "
                                f"it written as a literal{extra}")
                return None
        overrides[name] = value
    return overrides


def read(plan: Plan, options: MigrateOptions, device: str) -> Optional[AmpSetup]:
    """The script's one `amp.initialize` call, or None (with TODOs saying why) when it cannot be migrated."""
    analysis = plan.analysis
    uses = analysis.uses_of(apis.INITIALIZE)
    if len(uses) > 1:
        for use in uses:
            plan.todo(use.node, f"amp.initialize is called {len(uses)} times; migrate rewrites scripts with one "
                                "call (keep apexlite's amp: `from apexlite import amp`)")
        return None
    if not uses:
        return None
    use = uses[0]
    call = analysis.call_of(use)
    small = analysis.small_statement_of(use.node) if call is not None else None
    if call is None or not (isinstance(small, cst.Expr) and small.value is call or
                            isinstance(small, cst.Assign) and small.value is call):
        plan.todo(use.node, "amp.initialize is used other than as `models, optimizers = amp.initialize(...)`; "
                            "write it as that statement")
        return None
    bound = bind(call, POSITIONAL, KEYWORD_ONLY)
    if bound.error:
        plan.todo(call, f"amp.initialize cannot be read: {bound.error}")
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
    for name, why in _NO_NATIVE_OPTIONS.items():
        if bound.value(name) is not None and literal(analysis, bound.value(name)) is not None:
            if name == "max_loss_scale" and literal(analysis, bound.value(name)) == 2.0 ** 24:
                continue
            plan.todo(call, f"{name} has no native equivalent: {why}")
            return None
    level = _level(plan, options, bound, call)
    if level is None:
        return None
    model_targets, optimizer_targets = targets
    if level == "O2" and options.o2 == O2_APEXLITE:  # amp stays; apexlite resolves the options at run time
        return AmpSetup(use, call, small, bound.value("models"), bound.value("optimizers"), list(model_targets), list(optimizer_targets), KEEP, level, "float16",
                        "dynamic", 1, None)
    enabled_node = bound.value("enabled")
    enabled = literal(analysis, enabled_node)
    enabled_expr = None
    if enabled is NOT_LITERAL:
        if dotted_text(enabled_node) is None:
            plan.todo(call, "enabled= is an expression; assign it to a variable so autocast and GradScaler can "
                            "take it too")
            return None
        enabled_expr = dotted_text(enabled_node)
    overrides = _resolved_options(plan, options, bound, call, level)
    if overrides is None:
        return None
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
    num_losses = literal(analysis, bound.value("num_losses")) if bound.value("num_losses") is not None else 1
    if not isinstance(num_losses, int) or num_losses < 1:
        plan.todo(call, "num_losses must be a literal whole number >= 1 for migrate to give each loss its scaler")
        return None
    recipe, loss_scale = _recipe(plan, options, properties, enabled, call)
    if recipe is None:
        return None
    setup = AmpSetup(use, call, small, bound.value("models"), bound.value("optimizers"), list(model_targets), list(optimizer_targets), recipe, level,
                     "bfloat16" if recipe == AUTOCAST and properties.master_weights else dtype, loss_scale,
                     num_losses, enabled_expr)
    _choose_device(plan, setup, device)
    return setup


def _recipe(plan: Plan, options: MigrateOptions, properties, enabled: Any, call: cst.Call):
    if enabled is False:
        return NONE, 1.0
    loss_scale = properties.loss_scale
    if properties.patch_torch_functions:
        return AUTOCAST, loss_scale
    if properties.master_weights:  # O2 with --o2=bf16-autocast (O2_APEXLITE was kept before resolving)
        plan.comment(call, "O2 (fp16 weights, fp32 master weights) became bf16 autocast over the fp32 model "
                           "(--o2=bf16-autocast); bf16 needs no loss scaling")
        return AUTOCAST, 1.0  # bf16 autocast: fp32 weights, bf16 has fp32's range, no scaling
    if properties.cast_model_type in (None, False) or str(properties.cast_model_type) == "torch.float32":
        return NONE, loss_scale
    if properties.keep_batchnorm_fp32:
        plan.todo(call, "O3 with keep_batchnorm_fp32=True has no plain-torch form (fp16 activations into fp32 "
                        "batchnorm need apex's casts); use torch.autocast (O1) or keep apexlite's amp")
        return None, None
    if loss_scale != 1.0:
        plan.todo(call, f"O3 with loss_scale={loss_scale!r}: torch.amp.GradScaler refuses to unscale fp16 "
                        "gradients; use torch.autocast (O1) with a GradScaler, or keep apexlite's amp")
        return None, None
    return HALF, loss_scale


def _choose_device(plan: Plan, setup: AmpSetup, device: str) -> None:
    setup.device = device
    if device == RUNTIME:
        setup.device_expr = plan.fresh_name("amp_device_type")
    else:
        setup.device_expr = f'"{CUDA if device == CUDA else CPU}"'
