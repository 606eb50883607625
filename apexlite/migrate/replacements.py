"""apex.optimizers / apex.parallel / apex.normalization / apex.fp16_utils calls -> their torch equivalents,
as MIGRATION.md's "native" column names them. The rules are data: apex's signature (from apex's source),
the torch callable, and per argument whether it carries over, is dropped (it only tuned apex's kernels),
needs an explicit value (torch's default differs from apex's), or has no torch equivalent unless it keeps
apex's default (then the call stays, with a TODO).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

import libcst as cst
import torch

from apexlite.migrate import apis
from apexlite.migrate.device import CUDA
from apexlite.migrate.edits import Plan, expression
from apexlite.migrate.values import NOT_LITERAL, bind, literal

REQUIRED = object()


@dataclass(frozen=True)
class Rule:
    """How one apex callable becomes a torch one."""

    target: str
    params: Tuple[Tuple[str, Any], ...]  # apex's parameters in order, with apex's defaults
    positional: int = 1  # leading parameters passed positionally
    rename: Dict[str, str] = field(default_factory=dict)  # apex name -> torch name (others keep theirs)
    drop: Dict[str, str] = field(default_factory=dict)  # param -> why torch needs no counterpart
    no_equivalent: Dict[str, str] = field(default_factory=dict)  # param -> why, when not at apex's default
    write_defaults: Tuple[str, ...] = ()  # params whose apex default torch does not share: always written
    fused: bool = False  # torch.optim: add fused=True where valid (CUDA and a torch that takes it)
    choose_target: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None  # from the literal argument values

    def names(self) -> Tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def default(self, name: str) -> Any:
        return dict(self.params)[name]


def _adam_target(values: Dict[str, Any]) -> Optional[str]:
    mode = values.get("adam_w_mode", True)
    if mode is NOT_LITERAL:
        return None
    return "torch.optim.AdamW" if mode else "torch.optim.Adam"


_DDP_TUNING = ("message_size", "allreduce_trigger_params", "retain_allreduce_buffers",
               "num_allreduce_streams", "allreduce_communicators", "prof")
_SET_GRAD_NONE = "optimizer.zero_grad() sets gradients to None unless called with set_to_none=False"
_MEMORY_EFFICIENT = "it only traded memory for recomputation inside apex's kernel"
_NORM_PARAMS = (("normalized_shape", REQUIRED), ("eps", 1e-5), ("elementwise_affine", True),
                ("memory_efficient", False))

RULES: Dict[str, Rule] = {
    "apex.optimizers.fused_adam.FusedAdam": Rule(
        "torch.optim.AdamW",
        (("params", REQUIRED), ("lr", 1e-3), ("bias_correction", True), ("betas", (0.9, 0.999)), ("eps", 1e-8),
         ("adam_w_mode", True), ("weight_decay", 0.0), ("amsgrad", False), ("set_grad_none", True),
         ("capturable", False), ("master_weights", False)),
        drop={"adam_w_mode": "it chose AdamW (True) or Adam (False)", "set_grad_none": _SET_GRAD_NONE},
        no_equivalent={"bias_correction": "torch's Adam/AdamW always correct the moments' bias",
                       "amsgrad": "apex's FusedAdam refused amsgrad=True (the original raised)",
                       "capturable": "use torch.optim.AdamW(capturable=True) with CUDA graphs yourself",
                       "master_weights": "torch's AdamW keeps no fp32 master copy of fp16 params"},
        write_defaults=("weight_decay",), fused=True, choose_target=_adam_target),
    "apex.optimizers.fused_sgd.FusedSGD": Rule(
        "torch.optim.SGD",
        (("params", REQUIRED), ("lr", REQUIRED), ("momentum", 0), ("dampening", 0), ("weight_decay", 0),
         ("nesterov", False), ("wd_after_momentum", False), ("materialize_master_grads", True),
         ("set_grad_none", False)),
        drop={"materialize_master_grads": "it only shaped apex's O2 master gradients",
              "set_grad_none": _SET_GRAD_NONE},
        no_equivalent={"wd_after_momentum": "torch's SGD adds weight decay before momentum"}, fused=True),
    "apex.optimizers.fused_adagrad.FusedAdagrad": Rule(
        "torch.optim.Adagrad",
        (("params", REQUIRED), ("lr", 1e-2), ("eps", 1e-10), ("weight_decay", 0.0), ("set_grad_none", True),
         ("adagrad_w_mode", False)),
        drop={"set_grad_none": _SET_GRAD_NONE},
        no_equivalent={"adagrad_w_mode": "torch's Adagrad has only L2 weight decay"}),  # fused on CUDA: new in torch
    "apex.parallel.distributed.DistributedDataParallel": Rule(
        "torch.nn.parallel.DistributedDataParallel",
        (("module", REQUIRED), ("message_size", 10000000), ("delay_allreduce", False), ("shared_param", None),
         ("allreduce_trigger_params", None), ("retain_allreduce_buffers", False), ("allreduce_always_fp32", False),
         ("num_allreduce_streams", 1), ("allreduce_communicators", None), ("gradient_average", True),
         ("gradient_predivide_factor", 1.0), ("gradient_average_split_factor", None), ("prof", False)),
        rename={"delay_allreduce": "find_unused_parameters"},  # both reduce whatever grads a backward made
        drop={name: "it only tuned how apex's DDP overlapped communication" for name in _DDP_TUNING},
        no_equivalent={"shared_param": "apex had already retired it",
                       "allreduce_always_fp32": "register a DDP comm hook that all-reduces in fp32",
                       "gradient_average": "torch's DDP always averages; register a comm hook to sum",
                       "gradient_predivide_factor": "register a DDP comm hook that divides before the all-reduce",
                       "gradient_average_split_factor": "register a DDP comm hook that divides before the "
                                                        "all-reduce"}),
    "apex.parallel.sync_batchnorm.SyncBatchNorm": Rule(
        "torch.nn.SyncBatchNorm",
        (("num_features", REQUIRED), ("eps", 1e-5), ("momentum", 0.1), ("affine", True),
         ("track_running_stats", True), ("process_group", None), ("channel_last", False), ("fuse_relu", False)),
        no_equivalent={"channel_last": "use torch.channels_last tensors with torch.nn.SyncBatchNorm",
                       "fuse_relu": "apply torch.nn.functional.relu after the layer"}),
    "apex.parallel.convert_syncbn_model": Rule(
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        (("module", REQUIRED), ("process_group", None), ("channel_last", False)),
        no_equivalent={"channel_last": "use torch.channels_last tensors with torch.nn.SyncBatchNorm"}),
    "apex.normalization.fused_layer_norm.FusedLayerNorm": Rule(
        "torch.nn.LayerNorm", _NORM_PARAMS, drop={"memory_efficient": _MEMORY_EFFICIENT}),
    "apex.normalization.fused_layer_norm.FusedRMSNorm": Rule(
        "torch.nn.RMSNorm", _NORM_PARAMS, drop={"memory_efficient": _MEMORY_EFFICIENT}, write_defaults=("eps",)),
    "apex.fp16_utils.fp16util.clip_grad_norm": Rule(
        "torch.nn.utils.clip_grad_norm_", (("parameters", REQUIRED), ("max_norm", REQUIRED), ("norm_type", 2.0)),
        positional=2),
}
TO_PYTHON_FLOAT = ("apex.fp16_utils.fp16util.to_python_float", "apex.fp16_utils.loss_scaler.to_python_float")


def _torch_callable(target: str) -> Any:
    obj: Any = torch
    for part in target.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _takes_fused(target: str) -> bool:
    obj = _torch_callable(target)
    try:
        return obj is not None and "fused" in inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False


def _apply(plan: Plan, rule: Rule, call: cst.Call, device: str) -> None:
    analysis = plan.analysis
    bound = bind(call, rule.names())
    if bound.error:
        plan.todo(call, f"{rule.target} is its torch equivalent, but this call cannot be read: {bound.error}")
        return
    values = {name: literal(analysis, bound.value(name)) for name in bound.arguments}
    for name, why in rule.no_equivalent.items():
        if name in values and values[name] != rule.default(name):
            chosen = "is chosen at run time" if values[name] is NOT_LITERAL else f"`{name}={values[name]!r}`"
            plan.todo(call, f"{chosen if values[name] is not NOT_LITERAL else name + ' ' + chosen}: no {rule.target} "
                            f"equivalent ({why})")
            return
    target = rule.choose_target(values) if rule.choose_target else rule.target
    if target is None:
        plan.todo(call, "adam_w_mode is chosen at run time: write torch.optim.AdamW (True, apex's default) or "
                        "torch.optim.Adam (False), whichever you train with")
        return
    if _torch_callable(target) is None:
        plan.todo(call, f"{target} is its torch equivalent, but this torch ({torch.__version__}) does not have it; "
                        "upgrade torch or keep apexlite's")
        return
    parts = []
    for index, (name, default) in enumerate(rule.params):
        if name in rule.drop or name in rule.no_equivalent:  # dropped, or at apex's default (else a TODO above)
            continue
        given = bound.value(name)
        if index < rule.positional:
            if given is None:
                plan.todo(call, f"`{name}` is missing; apex required it")
                return
            parts.append(analysis.code(given))
        elif given is not None:
            parts.append(f"{rule.rename.get(name, name)}={analysis.code(given)}")
        elif name in rule.write_defaults:
            parts.append(f"{rule.rename.get(name, name)}={default!r}")
    if rule.fused and device == CUDA and _takes_fused(target):
        parts.append("fused=True")
    for name, why in rule.drop.items():
        if name in values and name != "adam_w_mode" and values[name] != rule.default(name):
            plan.comment(call, f"`{name}` dropped: {why}")
    code = f"{target}({', '.join(parts)})"
    plan.replace_expression(call, lambda _: expression(code))
    plan.needs_torch = True


def _to_python_float(plan: Plan, call: cst.Call) -> None:
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        plan.todo(call, "to_python_float(x) is x.item(); this call passes other arguments")
        return
    value = call.args[0].value
    code = plan.analysis.code(value)
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        code = f"({code})"
    plan.replace_expression(call, lambda _: expression(f"{code}.item()"))


TORCH_DDP = "torch.nn.parallel.DistributedDataParallel"


def _type_test(analysis, node: cst.CSTNode) -> bool:
    """Whether `node` is the class an isinstance/issubclass call tests against (alone or in a tuple of classes)."""
    parent = analysis.parent(node)
    if isinstance(parent, cst.Element):
        parent = analysis.parent(analysis.parent(parent)) if isinstance(analysis.parent(parent), cst.Tuple) else None
    call = analysis.parent(parent) if isinstance(parent, cst.Arg) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in (
        "isinstance", "issubclass") and len(call.args) == 2 and call.args[1] is parent


def plan_replacements(plan: Plan, device: str, keep_amp: bool = False) -> None:
    """Rewrite every call of an apex API that has a rule; other uses of those APIs get a TODO. Where O2's amp
    stays on apexlite (`keep_amp`), apex's DDP does not become torch's: it would leave each rank the fp32
    masters amp.initialize built from that rank's own weights. A name imported from apex.parallel is
    imported from apexlite.parallel instead (imports.py: `ddp_from_apex_args`, apex's arguments, which
    broadcasts rank 0's masters); any other spelling gets a TODO saying so. `isinstance(model, DDP)` tests
    against torch's DDP, which what either rewrite builds is (ddp_from_apex_args's class subclasses it)."""
    analysis = plan.analysis
    for use in analysis.uses:
        rule = RULES.get(use.api)
        if (rule is None and use.api not in TO_PYTHON_FLOAT) or plan.is_handled(use.node):
            continue
        plan.handle(use.node)
        if use.api == apis.APEX_DDP and _type_test(analysis, use.node):
            plan.replace_expression(use.node, lambda _: expression(TORCH_DDP))  # what either rewrite builds is one
            plan.needs_torch = True
            continue
        if keep_amp and use.api == apis.APEX_DDP:
            if not isinstance(use.node, cst.Name) or use.star:
                plan.todo(use.node, "amp may run O2 here and stays on amp's API: build this DDP with "
                                    "apexlite.parallel.ddp_from_apex_args (apex's arguments), which broadcasts rank "
                                    "0's fp32 master weights with its weights; torch's DDP would leave each rank the "
                                    "masters of its own weights")
            continue
        call = analysis.call_of(use)
        target = rule.target if rule is not None else "x.item()"
        if call is None:
            plan.todo(use.node, f"`{analysis.code(use.node)}` is used other than as a call; its torch equivalent "
                                f"is {target}")
        elif rule is None:
            _to_python_float(plan, call)
        else:
            _apply(plan, rule, call, device)

