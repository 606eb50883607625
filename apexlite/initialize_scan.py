"""What `check` can tell from a script's `amp.initialize(...)` calls before running it: options apexlite
refuses (`opt_level="01"`, `keep_batchnorm_fp32="yes"`, keep_batchnorm_fp32 at O1, ...), read from their
literal values (or a module constant bound once, or an argparse default, which the row names) and validated by
the same functions `amp.initialize` runs; a half model or an FP16_Optimizer handed to it
(apexlite.initialize_inputs); and `optimizer.step(closure)` on an optimizer initialize returned. Other values
are left to the run.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch

from apexlite import api_status, initialize_inputs
from apexlite.amp import checks
from apexlite.amp.environment import parse_dtype, settle_model_dtype
from apexlite.amp.frontend import initialize
from apexlite.amp.opt_levels import resolve_properties

Row = Tuple[str, List[int], str]
INITIALIZE = "apex.amp.initialize"
CALL_ROW = "apex.amp.initialize(...)"
FP16_OPTIMIZERS = ("apex.fp16_utils.FP16_Optimizer", "apex.fp16_utils.fp16_optimizer.FP16_Optimizer")
STEP_ROW = "optimizer.step(closure)"
O2_CLIP_ROW = "clip of model.parameters() at O2"
_PARAMETERS = list(inspect.signature(initialize).parameters)
_UNKNOWN = object()


def _literal(node: ast.AST) -> Any:
    """The value of a literal argument (`"O1"`, `True`, `128.0`, `torch.float16`), else _UNKNOWN."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        value = getattr(torch, node.attr, None)
        return value if isinstance(value, torch.dtype) else _UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


class Defaults:
    """What a script's names stand for before it runs: module-level names bound once to a literal
    (`OPT_LEVEL = "O1"`), and `args.X` where an argparse option with dest X has a literal default."""

    def __init__(self, tree: ast.Module) -> None:
        stored: Dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stored[node.id] = stored.get(node.id, 0) + 1
        self.constants = {statement.targets[0].id: _literal(statement.value) for statement in tree.body
                          if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                          and isinstance(statement.targets[0], ast.Name) and stored[statement.targets[0].id] == 1}
        self.options: Dict[str, Tuple[str, Any]] = {}  # dest -> (the option's flag, its default)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                flags = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
                keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                if not flags or "default" not in keywords:
                    continue
                long = next((flag for flag in flags if flag.startswith("--")), flags[0])
                dest = _literal(keywords["dest"]) if "dest" in keywords else long.lstrip("-").replace("-", "_")
                self.options[dest] = (long, _literal(keywords["default"]))

    def value(self, node: ast.AST) -> Tuple[Any, Optional[str]]:
        """(the value, the argparse option it is the default of, if it is one), or (_UNKNOWN, None)."""
        value = _literal(node)
        if value is not _UNKNOWN:
            return value, None
        if isinstance(node, ast.Name):
            return self.constants.get(node.id, _UNKNOWN), None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr in self.options:
            flag, default = self.options[node.attr]
            return default, f"{flag} {default!r}" if default is not _UNKNOWN else None
        return _UNKNOWN, None


def _arguments(call: ast.Call, defaults: Optional[Defaults] = None) -> Optional[Tuple[Dict[str, Any], List[str]]]:
    """initialize's arguments by name (literals, or what `defaults` resolves), and the argparse defaults used;
    None when *args/**kwargs hide which is which."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(k.arg is None for k in call.keywords):
        return None
    named = dict(zip(_PARAMETERS, call.args))
    named.update({keyword.arg: keyword.value for keyword in call.keywords})
    values, used = {}, []
    for name, node in named.items():
        values[name], option = defaults.value(node) if defaults is not None else (_literal(node), None)
        if option is not None:
            used.append(option)
    return values, used


def refusal(call: ast.Call, defaults: Optional[Defaults] = None) -> Optional[str]:
    """Why `amp.initialize` would raise for this call's options, or None when it cannot tell; options that are
    argparse defaults are named (the run may pass others)."""
    found = _arguments(call, defaults)
    if found is None:
        return None
    given, options = found
    why = _refusal(call, given)
    if why is None or not options:
        return why
    return f"with the script's defaults ({', '.join(options)}): {why}"


def _refusal(call: ast.Call, given: Dict[str, Any]) -> Optional[str]:
    known = {name: value for name, value in given.items() if value is not _UNKNOWN}
    if isinstance(call.args[0] if call.args else None, ast.Tuple):
        return "models given as a tuple: pass one model or a list of models"
    try:
        if not checks.check_enabled(known.get("enabled", True)):
            return None
    except ValueError as error:
        return str(error)
    if "opt_level" in given and "opt_level" not in known:
        return None  # chosen at run time
    try:
        checks.check_scalar_arguments(known.get("num_losses", 1), known.get("verbosity", 1),
                                      known.get("min_loss_scale"), known.get("max_loss_scale", 2.0 ** 24))
        checks.check_cast_model_outputs(known.get("cast_model_outputs"))
        low_dtype = parse_dtype(known.get("dtype") or torch.float16)
        cast_model_type, low_dtype = settle_model_dtype(known.get("cast_model_type"), known.get("dtype"), low_dtype)
        overrides = {name: known.get(name) for name in ("patch_torch_functions", "keep_batchnorm_fp32",
                                                        "master_weights", "loss_scale")}
        resolve_properties(known.get("opt_level", "O1"), low_dtype, dict(overrides, cast_model_type=cast_model_type))
    except (ValueError, TypeError, RuntimeError) as error:
        return str(error)
    return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _resolves_to(node: ast.AST, aliases: Dict[str, str]) -> str:
    dotted = _dotted(node)
    head, _, rest = dotted.partition(".")
    return ".".join(filter(None, [aliases.get(head, ""), rest])) if head in aliases else ""


def problems(tree: ast.Module, aliases: Dict[str, str]) -> List[Row]:
    """Rows for `check`: each initialize call apexlite would refuse, and `step(closure)` on its optimizers
    (`aliases`: the script's names for apex's modules, as apex_uses found them)."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and _resolves_to(node.func, aliases) == INITIALIZE]
    rows: List[Row] = []
    defaults = Defaults(tree)
    refused = {call.lineno: refusal(call, defaults) for call in calls}
    for line, why in sorted((line, why) for line, why in refused.items() if why is not None):
        rows.append((CALL_ROW, [line], f"{api_status.RAISES}: amp.initialize raises here: {why}"))
    rows.extend(initialize_inputs.problems(
        tree, lambda func: _resolves_to(func, aliases) == INITIALIZE,
        lambda node: isinstance(node, ast.Call) and _resolves_to(node.func, aliases) in FP16_OPTIMIZERS, CALL_ROW))
    returned = {_dotted(target) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(node.value is call for call in calls)
                for outer in node.targets for target in (outer.elts if isinstance(outer, ast.Tuple) else [outer])}
    returned.discard("")
    closures = sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                      and _dotted(node.func.value) in returned and (node.args or any(
                          keyword.arg == "closure" for keyword in node.keywords)))
    levels = {_literal(keyword.value) for call in calls for keyword in call.keywords if keyword.arg == "opt_level"}
    clips = sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
                   and _dotted(node.func).rsplit(".", 1)[-1] in api_status.CLIP_FUNCTIONS
                   and isinstance(node.args[0], ast.Call) and _dotted(node.args[0].func).endswith(".parameters"))
    if "O2" in levels and clips:
        rows.append((O2_CLIP_ROW, clips, f"{api_status.DIFFERS}: at O2 this clips the model's half grads, still "
                                         "multiplied by the loss scale, not the fp32 master grads the update "
                                         "uses (apex alike; apexlite warns at the step): clip "
                                         "amp.master_params(optimizer)"))
    if closures:
        rows.append((STEP_ROW, closures, f"{api_status.RAISES}: amp raises at this step: a closure's backward "
                                         "would bypass amp.scale_loss; run the forward and scale_loss yourself, "
                                         "then call step() without a closure"))
    return rows
