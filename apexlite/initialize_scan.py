"""What `check` can tell from a script's `amp.initialize(...)` calls before running it: options apexlite
refuses (`opt_level="01"`, `keep_batchnorm_fp32="yes"`, keep_batchnorm_fp32 at O1, ...), read from their
literal values and validated by the same functions `amp.initialize` runs, and `optimizer.step(closure)` on
an optimizer initialize returned. Values that are not literals are left to the run.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Dict, List, Optional, Tuple

import torch

from apexlite import api_status
from apexlite.amp import checks
from apexlite.amp.environment import parse_dtype, settle_model_dtype
from apexlite.amp.frontend import initialize
from apexlite.amp.opt_levels import resolve_properties

Row = Tuple[str, List[int], str]
INITIALIZE = "apex.amp.initialize"
CALL_ROW = "apex.amp.initialize(...)"
STEP_ROW = "optimizer.step(closure)"
O2_CLIP_ROW = "clip of model.parameters() at O2"
CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")
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


def _arguments(call: ast.Call) -> Optional[Dict[str, Any]]:
    """initialize's arguments by name, literals only; None when *args/**kwargs hide which is which."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(k.arg is None for k in call.keywords):
        return None
    named = dict(zip(_PARAMETERS, call.args))
    named.update({keyword.arg: keyword.value for keyword in call.keywords})
    return {name: _literal(node) for name, node in named.items()}


def refusal(call: ast.Call) -> Optional[str]:
    """Why `amp.initialize` would raise for this call's literal options, or None when it cannot tell."""
    given = _arguments(call)
    if given is None:
        return None
    known = {name: value for name, value in given.items() if value is not _UNKNOWN}
    if isinstance(call.args[0] if call.args else None, ast.Tuple):
        return "models given as a tuple: pass one model or a list of models"
    if known.get("enabled", True) is False:
        return None
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
    refused = {call.lineno: refusal(call) for call in calls}
    for line, why in sorted((line, why) for line, why in refused.items() if why is not None):
        rows.append((CALL_ROW, [line], f"{api_status.RAISES}: amp.initialize raises here: {why}"))
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
                   and _dotted(node.func).rsplit(".", 1)[-1] in CLIP_FUNCTIONS and isinstance(node.args[0], ast.Call)
                   and _dotted(node.args[0].func).endswith(".parameters"))
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
