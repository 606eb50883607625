"""The one NovoGrad update rule of apexlite, shared by ``FusedNovoGrad`` and ``multi_tensor_novograd``.

The second moment is one float32 number per tensor, kept in ``grad_norms`` and first blended with the
new gradient's norm (see :func:`apexlite.optimizers.multi_tensor.norms.blend_norms`). Then per tensor,
in float32, with c1 = 1 - beta1**step, c2 = sqrt(1 - beta2**step) (both 1 without bias correction),
beta3 = 1 - beta1 with grad averaging (else 1) and d = n / c2 + eps (apex's multi_tensor_novograd):

    moment mode 0 (regularisation inside the moment):  m = beta1*m + beta3*(g/d + wd*p);  p -= lr * m/c1
    moment mode 1 (decoupled):                          m = beta1*m + beta3*g;  p -= lr * (m/c1/d + wd*p)
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from apexlite.optimizers.multi_tensor.norms import blend_norms

INSIDE_MOMENT_MODE, DECOUPLED_MODE = 0, 1


def novograd_update(grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                    grad_norms: torch.Tensor, *, lr: float, beta1: float, beta2: float, eps: float, step: int,
                    bias_correction: bool, weight_decay: float, grad_averaging: bool, moment_mode: int,
                    norm_type: int) -> None:
    """One NovoGrad step over parallel lists, in place; ``grad_norms`` holds one norm per tensor."""
    if moment_mode not in (INSIDE_MOMENT_MODE, DECOUPLED_MODE):
        raise ValueError(f"NovoGrad moment mode must be 0 or 1; got {moment_mode}.")
    if grad_norms.numel() != len(grads) or grad_norms.dtype != torch.float32:
        raise ValueError(f"NovoGrad needs one float32 norm per tensor: got a {grad_norms.dtype} tensor of "
                         f"{grad_norms.numel()} norms for {len(grads)} tensors.")
    blend_norms(list(grads), grad_norms, beta2, norm_type)
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = math.sqrt(1 - beta2 ** step) if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    for index, (grad, param, exp_avg) in enumerate(zip(grads, params, exp_avgs)):
        g, p, m = grad.float(), param.float(), exp_avg.float()
        denom = grad_norms[index].to(p.device) / c2 + eps
        if moment_mode == INSIDE_MOMENT_MODE:
            m = m.mul_(beta1).add_(g / denom + weight_decay * p, alpha=beta3)
            new_p = p - lr * (m / c1)
        else:
            m = m.mul_(beta1).add_(g, alpha=beta3)
            new_p = p - lr * (m / c1 / denom + weight_decay * p)
        param.copy_(new_p)
        if m is not exp_avg:
            exp_avg.copy_(m)
