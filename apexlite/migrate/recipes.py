"""The native recipe an amp.initialize call becomes (initialize.py reads the call and resolves its options):
  - AUTOCAST (O1; O2 with --o2=bf16-autocast): torch.autocast around the forward and loss;
  - HALF (O3): the model cast to fp16/bf16;
  - NONE (O0, enabled=False): plain fp32 training;
  - KEEP (O2 by default; O3 with fp32 batchnorm or with an fp16 loss scale): amp stays, from apexlite, with
    the reason torch has no form of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst

from apexlite.migrate.edits import Plan

AUTOCAST, HALF, NONE, KEEP = "autocast", "half", "none", "keep"
O2_KEPT_REASON = ("O2's fp32 master weights have no torch.amp recipe; --o2=bf16-autocast moves it to native bf16 "
                  "autocast instead")


@dataclass
class Kept:
    """The KEEP recipe chosen after resolving the options, and why torch has no form of them."""

    reason: str


def choose_recipe(plan: Plan, properties, enabled: Any, call: cst.Call, anchor: Optional[cst.CSTNode] = None):
    """(recipe, loss scale) for resolved amp `properties`: a Kept where torch has no form of them."""
    if enabled is False:
        return NONE, 1.0
    loss_scale = properties.loss_scale
    if properties.patch_torch_functions:
        return AUTOCAST, loss_scale
    if properties.master_weights:  # O2 with --o2=bf16-autocast (O2_APEXLITE was kept before resolving)
        plan.comment(anchor if anchor is not None else call, "O2 (fp16 weights, fp32 master weights) became bf16 "
                     "autocast over the fp32 model (--o2=bf16-autocast); bf16 needs no loss scaling")
        return AUTOCAST, 1.0  # bf16 autocast: fp32 weights, bf16 has fp32's range, no scaling
    if properties.cast_model_type in (None, False) or str(properties.cast_model_type) == "torch.float32":
        return NONE, loss_scale
    if properties.keep_batchnorm_fp32:
        return Kept("O3 with keep_batchnorm_fp32=True has no plain-torch form (low-precision activations into "
                    "fp32 batchnorm need amp's casts); to go native, train with O1 (torch.autocast) instead"), None
    if loss_scale != 1.0:
        return Kept(f"O3 with loss_scale={loss_scale!r} has no plain-torch form (torch.amp.GradScaler refuses to "
                    "unscale fp16 gradients); to go native, train with O1 (torch.autocast) and a GradScaler "
                    "instead"), None
    return HALF, loss_scale
