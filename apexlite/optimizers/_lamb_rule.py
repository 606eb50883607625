"""The one LAMB update rule of apexlite, shared by ``FusedLAMB``, ``FusedMixedPrecisionLamb``, the
2019 contrib ``FusedLAMB`` and the ``multi_tensor_lamb*`` kernels.

Stage 1, per tensor, in float32 (apex's LAMBStage1Functor): with the gradient g (times ``inv_scale``
when given) divided by the clip divisor (global norm / max norm when the global norm exceeds a
positive max norm, else 1), c1 = 1 - beta1**step and c2 = 1 - beta2**step (1 without bias
correction), and beta3 = 1 - beta1 with grad averaging (else 1):

    L2 (adam_w_mode off):  g += wd * p
    m = beta1*m + beta3*g;   v = beta2*v + (1-beta2)*g*g
    u = (m/c1) / (sqrt(v/c2) + eps)     (+ wd * p with adam_w_mode)

Stage 2 (LAMBStage2Functor): ratio = lr * ||p|| / ||u|| when weight decay is nonzero or NVLAMB is on
and both norms are nonzero, else lr; p -= ratio * u (||p|| taken before the update). Step counts,
learning rates and norms may be tensors on the device, so nothing here waits for the device.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Union

import torch

Scalar = Union[float, torch.Tensor]


class LambStep(NamedTuple):
    """What one LAMB step computed: float32 update directions and the per-tensor norms it used."""

    updates: List[torch.Tensor]
    param_norms: List[torch.Tensor]
    update_norms: List[torch.Tensor]


def bias_corrections(beta1: float, beta2: float, step: Scalar, bias_correction: bool):
    """(1 - beta1**step, 1 - beta2**step), or (1.0, 1.0) without bias correction; tensors when step is."""
    if not bias_correction:
        return 1.0, 1.0
    if isinstance(step, torch.Tensor):
        step = step.reshape(()).to(torch.float32)
    return 1 - beta1 ** step, 1 - beta2 ** step


def clip_divisor(global_grad_norm: Scalar, max_grad_norm: Scalar) -> Optional[torch.Tensor]:
    """What the gradients are divided by: norm / max when norm > max > 0, else 1; None when max <= 0.

    apex divided by norm / max for any max, so a max of 0 zeroed every gradient and a negative one
    flipped them; apexlite treats max <= 0 as "no clipping".
    """
    if not isinstance(max_grad_norm, torch.Tensor) and max_grad_norm <= 0:
        return None
    norm = torch.as_tensor(global_grad_norm, dtype=torch.float32).reshape(())
    if isinstance(max_grad_norm, torch.Tensor):
        limit = max_grad_norm.to(device=norm.device, dtype=torch.float32).reshape(())
    else:
        limit = torch.full((), float(max_grad_norm), device=norm.device)
    return torch.where((limit > 0) & (norm > limit), norm / limit, torch.ones_like(norm))


def lamb_directions(grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                    exp_avg_sqs: Sequence[torch.Tensor], *, beta1: float, beta2: float, beta3: float,
                    bias_correction1: Scalar, bias_correction2: Scalar, eps: float,
                    weight_decays: Sequence[Scalar], adam_w_mode: bool, grad_divisor: Optional[torch.Tensor],
                    inv_scale: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """Stage 1: updates the moments in place and returns each tensor's float32 update direction."""
    updates = []
    for grad, param, exp_avg, exp_avg_sq, decay in zip(grads, params, exp_avgs, exp_avg_sqs, weight_decays):
        g = grad.float()
        if inv_scale is not None:
            g = g * inv_scale.to(g.device)
        if grad_divisor is not None:
            g = g / grad_divisor.to(g.device)
        p = param.float()
        decays = not (isinstance(decay, (int, float)) and decay == 0)  # apex skips reading p then
        if decays and not adam_w_mode:
            g = g + decay * p
        m = exp_avg.float().mul_(beta1).add_(g, alpha=beta3)  # in place when the moment is float32
        v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1 - beta2)
        update = (m / bias_correction1) / ((v / bias_correction2).sqrt() + eps)
        if decays and adam_w_mode:
            update = update + decay * p
        for stored, value in ((exp_avg, m), (exp_avg_sq, v)):
            if stored is not value:
                stored.copy_(value)
        updates.append(update)
    return updates


def per_tensor_norms(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Float32 0-d L2 norms, one per tensor, on each tensor's device."""
    return list(torch._foreach_norm([t.float() for t in tensors], 2.0))


def apply_trust_ratio(params: Sequence[torch.Tensor], updates: Sequence[torch.Tensor], *, lr: Scalar,
                      weight_decay: float, use_nvlamb: bool, param_norms: Sequence[torch.Tensor],
                      update_norms: Sequence[torch.Tensor],
                      model_copies: Optional[Sequence[torch.Tensor]] = None) -> None:
    """Stage 2: p -= ratio * u with LAMB's per-tensor trust ratio; model copies receive the new p."""
    adaptive = use_nvlamb or weight_decay != 0
    copies = model_copies if model_copies else [None] * len(params)
    for param, update, param_norm, update_norm, copy in zip(params, updates, param_norms, update_norms, copies):
        ratio = lr.to(param.device) if isinstance(lr, torch.Tensor) else lr
        if adaptive:
            pn, un = param_norm.to(param.device), update_norm.to(param.device)
            ratio = torch.where((pn != 0) & (un != 0), ratio * pn / un, ratio * torch.ones_like(pn))
        new_param = param.float() - ratio * update.float()
        param.copy_(new_param)
        if copy is not None:
            copy.copy_(new_param)


def lamb_update(grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                exp_avg_sqs: Sequence[torch.Tensor], model_copies: Optional[Sequence[torch.Tensor]] = None, *,
                lr: Scalar, beta1: float, beta2: float, eps: float, step: Scalar, bias_correction: bool,
                weight_decay: float, grad_averaging: bool, adam_w_mode: bool, global_grad_norm: Scalar,
                max_grad_norm: Scalar, use_nvlamb: bool,
                inv_scale: Optional[torch.Tensor] = None) -> LambStep:
    """One LAMB step (both stages) over parallel lists, in place."""
    c1, c2 = bias_corrections(beta1, beta2, step, bias_correction)
    param_norms = per_tensor_norms(params)
    updates = lamb_directions(
        grads, params, exp_avgs, exp_avg_sqs, beta1=beta1, beta2=beta2,
        beta3=1 - beta1 if grad_averaging else 1.0, bias_correction1=c1, bias_correction2=c2, eps=eps,
        weight_decays=[weight_decay] * len(params), adam_w_mode=adam_w_mode,
        grad_divisor=clip_divisor(global_grad_norm, max_grad_norm), inv_scale=inv_scale)
    update_norms = per_tensor_norms(updates)
    apply_trust_ratio(params, updates, lr=lr, weight_decay=weight_decay, use_nvlamb=use_nvlamb,
                      param_norms=param_norms, update_norms=update_norms, model_copies=model_copies)
    return LambStep(updates, param_norms, update_norms)
