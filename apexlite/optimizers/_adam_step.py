"""The functional FusedAdam step: one call per (device, dtype) bucket, routed to a kernel or to torch.

Routing rules (``implementation``):

* ``"auto"``: the compiled kernel for the bucket's device when it exists, else the pure-torch
  reference with a one-time warning (see :mod:`apexlite._ext`);
* ``"kernel"``: the compiled kernel, or a ``RuntimeError`` that says how to build it;
* ``"reference"``: always the pure-torch reference (``apexlite.optimizers._reference``).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from apexlite import _ext
from apexlite.optimizers._reference import reference_adam_step

IMPLEMENTATIONS = ("auto", "kernel", "reference")


def uses_kernel(implementation: str, device: torch.device) -> bool:
    """Whether a bucket on ``device`` goes to the compiled kernel under ``implementation``."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "reference":
        return False
    if _ext.kernels_available(device.type):
        return True
    if implementation == "kernel":
        raise RuntimeError(
            f"FusedAdam(implementation='kernel'): no compiled kernel for {device.type} "
            f"({_ext.status().detail}). To fix: {_ext.BUILD_HINT}; or pass implementation='auto'."
        )
    _ext.warn_fallback(device.type)
    return False


def fused_adam_step(
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    exp_avgs: List[torch.Tensor],
    exp_avg_sqs: List[torch.Tensor],
    state_steps: List[torch.Tensor],
    model_copies: List[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    adam_w_mode: bool,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
    implementation: str = "auto",
) -> bool:
    """Runs one Adam/AdamW step over lists that share a device and, per list, a dtype.

    The arguments are those of the ``apexlite::fused_adam_`` op (documented in
    ``csrc/torch/ops.cpp`` and :func:`~apexlite.optimizers._reference.reference_adam_step`).
    Returns True when the compiled kernel ran, False for the pure-torch path.
    """
    if not params:
        return False
    kernel = uses_kernel(implementation, params[0].device)
    step = torch.ops.apexlite.fused_adam_ if kernel else reference_adam_step
    step(
        params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies,
        lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
        bias_correction=bias_correction, adam_w_mode=adam_w_mode,
        grad_scale=grad_scale, found_inf=found_inf,
    )
    return kernel
