"""Pure-torch Adam/AdamW step with the exact contract of the compiled ``apexlite::fused_adam_`` op.

It is three things at once: the fallback when the native kernels are missing, the oracle the kernel
tests compare against, and the readable statement of what the kernels compute. The operation order
mirrors ``csrc/include/apexlite/adam_math.h`` (and torch.optim.Adam's single-tensor form): unscale,
weight decay, moments, bias-corrected step, all in float32 whatever the storage dtypes are.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch


def _step_scalars(step: float, lr: float, beta1: float, beta2: float, bias_correction: bool):
    """(step_size, sqrt(bias_correction2)) in double, the way the kernels derive them."""
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    return lr / bc1, math.sqrt(bc2)


def reference_adam_step(
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
    unscale_grads: bool = False,
) -> None:
    """One Adam (``adam_w_mode=False``, L2) or AdamW (decoupled) step, in place.

    Args mirror the op: ``params`` are the tensors the math runs on (fp32 masters, or the weights
    themselves), ``model_copies`` is empty or receives the updated params rounded to its dtype,
    ``grad_scale`` (the loss scale) divides the gradients (and, with ``unscale_grads``, the unscaled
    values are stored back into ``grads``), a nonzero ``found_inf`` leaves every tensor, step
    counters and grads included, untouched.

    .. note:: Reading ``found_inf`` and ``grad_scale`` synchronises with their device. The compiled
       CUDA kernel avoids that; this path favours clarity.
    """
    if found_inf is not None and bool(found_inf.item() != 0):
        return
    inv_scale = 1.0 if grad_scale is None else 1.0 / float(grad_scale.item())
    copies = model_copies if model_copies else [None] * len(params)
    for param, grad, exp_avg, exp_avg_sq, step_t, copy in zip(
        params, grads, exp_avgs, exp_avg_sqs, state_steps, copies
    ):
        step_t.add_(1)
        step_size, bc2_sqrt = _step_scalars(float(step_t.item()), lr, beta1, beta2, bias_correction)
        p = param if param.dtype == torch.float32 else param.float()
        g = grad.float()
        if inv_scale != 1.0:
            g = g * inv_scale
        if unscale_grads and grad_scale is not None and g is not grad:
            grad.copy_(g)  # before weight decay joins it: what GradScaler's unscale would leave
        m = exp_avg if exp_avg.dtype == torch.float32 else exp_avg.float()
        v = exp_avg_sq if exp_avg_sq.dtype == torch.float32 else exp_avg_sq.float()
        if weight_decay != 0:
            if adam_w_mode:
                p.mul_(1.0 - lr * weight_decay)
            else:
                g = g.add(p, alpha=weight_decay)
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt().div_(bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)
        for stored, updated in ((param, p), (exp_avg, m), (exp_avg_sq, v), (copy, p)):
            if stored is not None and stored is not updated:
                stored.copy_(updated)
