"""The apex uses no other planner rewrote: the exact rewrites still possible, and for the rest a TODO that
says what to write instead.

`multi_tensor_applier.available` is always True under torch (torch's foreach ops need no extension), so
it becomes `True` and its import goes. Everything else keeps its code under a TODO naming the import the
script used and the native code that replaces it; the table is keyed by the canonical apex name (or a
prefix ending in "."), the most specific entry wins.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from apexlite.migrate.analysis import ApexUse
from apexlite.migrate.edits import Plan, expression

ALWAYS_TRUE = ("apex.multi_tensor_apply.multi_tensor_applier.available",)

_AUTOCAST_RECIPE = ("train the fp32 model under torch.autocast with a torch.amp.GradScaler: `optimizer.backward(loss)` "
                    "becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes `scaler.step(optimizer)` "
                    "then `scaler.update()`, `optimizer.clip_master_grads(n)` becomes `scaler.unscale_(optimizer)` "
                    "then `torch.nn.utils.clip_grad_norm_(model.parameters(), n)`")
_NO_MASTERS = ("with torch.autocast over an fp32 model there are no fp16 copies to keep in step: drop this call "
               "and let the optimizer update the model's own parameters")
_KEEP = "or keep running the script under apexlite (`python -m apexlite run`), which provides it"

INSTRUCTIONS = {
    "apex.fp16_utils.fp16_optimizer.FP16_Optimizer":
        f"it wraps the optimizer with fp32 master weights of an fp16 model, which torch has no class for: drop "
        f"the wrapper and `.half()`, keep the wrapped optimizer, and {_AUTOCAST_RECIPE}",
    "apex.contrib.optimizers.fp16_optimizer.FP16_Optimizer":
        f"apex's 2019 wrapper of its old FusedAdam: build torch.optim.AdamW (fused=True on CUDA) over the fp32 "
        f"model instead of the wrapper, drop `.half()`, and {_AUTOCAST_RECIPE}",
    "apex.fp16_utils.fp16util.network_to_half": "drop it (the model stays fp32) and run the forward pass under "
                                                "torch.autocast, which keeps batchnorm in fp32 by itself",
    "apex.fp16_utils.fp16util.convert_network": "drop it (the model stays fp32) and run the forward pass under "
                                                "torch.autocast",
    "apex.fp16_utils.fp16util.convert_module": "drop it (the model stays fp32) and run the forward pass under "
                                               "torch.autocast",
    "apex.fp16_utils.fp16util.BN_convert_float": "drop it with the model's `.half()` and run the forward pass "
                                                 "under torch.autocast",
    "apex.fp16_utils.fp16util.FP16Model": "use the fp32 model itself and run its forward pass under torch.autocast",
    "apex.fp16_utils.fp16util.tofp16": "drop it and run the forward pass under torch.autocast",
    "apex.fp16_utils.fp16util.prep_param_lists": _NO_MASTERS,
    "apex.fp16_utils.fp16util.model_grads_to_master_grads": _NO_MASTERS,
    "apex.fp16_utils.fp16util.master_params_to_model_params": _NO_MASTERS,
    "apex.fp16_utils.loss_scaler.": "use torch.amp.GradScaler (`init_scale=N, growth_interval=2**31 - 1` for a "
                                    "static scale): `scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
                                    "`scaler.update()`",
    "apex.multi_tensor_apply.": "call torch's foreach ops on the tensor lists yourself (torch._foreach_mul_, "
                                "torch._foreach_norm, ...); torch chunks them itself",
    "amp_C.": "use torch's foreach ops (torch._foreach_mul_ for multi_tensor_scale, torch._foreach_norm for "
              "multi_tensor_l2norm) or a torch.optim optimizer with fused=True for the optimizer kernels",
    "apex.normalization.fused_layer_norm.MixedFusedLayerNorm":
        "use torch.nn.LayerNorm (fp32 parameters) and call it on the input cast to its parameters' dtype "
        "(`norm(x.to(norm.weight.dtype))`): the mixed norm took fp16/bf16 inputs and returned that dtype",
    "apex.normalization.fused_layer_norm.MixedFusedRMSNorm":
        "use torch.nn.RMSNorm (fp32 parameters) and call it on the input cast to its parameters' dtype "
        "(`norm(x.to(norm.weight.dtype))`): the mixed norm took fp16/bf16 inputs and returned that dtype",
    "apex.normalization.fused_layer_norm.": "use torch.nn.functional.layer_norm / rms_norm (or torch.nn.LayerNorm "
                                            "/ RMSNorm modules)",
    "apex.optimizers.fused_lamb.FusedLAMB": "torch has no LAMB: keep apexlite's (`from apexlite.optimizers import "
                                            "FusedLAMB`) or choose a torch.optim optimizer",
    "apex.optimizers.fused_mixed_precision_lamb.FusedMixedPrecisionLamb":
        "torch has no LAMB: keep apexlite's (`from apexlite.optimizers import FusedMixedPrecisionLamb`) or choose "
        "a torch.optim optimizer",
    "apex.optimizers.fused_novograd.FusedNovoGrad": "torch has no NovoGrad: keep apexlite's (`from "
                                                    "apexlite.optimizers import FusedNovoGrad`) or choose a "
                                                    "torch.optim optimizer",
    "apex.parallel.LARC.LARC": "torch has no LARC wrapper: scale each parameter group's learning rate by the "
                               "trust ratio ||w|| / ||grad|| yourself before `optimizer.step()`",
    "apex.contrib.": "apex.contrib's extensions have no torch counterpart: replace the feature",
}


def instruction(api: str) -> Optional[str]:
    """What to write instead of the canonical apex name `api` (the most specific entry), if the table knows."""
    matches = [key for key in INSTRUCTIONS if api == key or (key.endswith(".") and api.startswith(key))]
    return INSTRUCTIONS[max(matches, key=len)] if matches else None


def _imported_as(use: ApexUse) -> str:
    """The apex name as the script reached it (`apex.fp16_utils.FP16_Optimizer`), not its canonical one."""
    return f"{use.written}, by `import *`" if use.star else use.written


def plan_leftovers(plan: Plan) -> None:
    """Rewrite or leave a TODO for every apex use no planner took."""
    analysis = plan.analysis
    for use in analysis.uses:
        if plan.is_handled(use.node):
            continue
        if use.api in ALWAYS_TRUE and _is_read(plan, use.node):
            plan.replace_expression(use.node, lambda _: expression("True"))
            continue
        what = instruction(use.api) or ("replace it by hand (MIGRATION.md's table for its module names the native "
                                        f"code) {_KEEP}")
        plan.todo(use.node, f"`{analysis.code(use.node)}` ({_imported_as(use)}) has no exact torch rewrite: {what}")


def _is_read(plan: Plan, node: cst.CSTNode) -> bool:
    parent = plan.analysis.parent(node)
    return not (isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or isinstance(parent, cst.Del))
