"""``FusedLAMB``: apex's LAMB (Adam moments, global grad-norm clipping, per-tensor trust ratio)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Tuple

import torch

from apexlite.optimizers._base import ApexStyleOptimizer


class FusedLAMB(ApexStyleOptimizer):
    """LAMB with apex's constructor and update rule (fp32 math and state; params may be fp16/bf16).

    Each step: the L2 norm G of all gradients (over every group) is computed; when
    ``max_grad_norm > 0`` and G exceeds it, gradients are divided by G / max_grad_norm. Then per param,
    with c1 = 1 - beta1^t and c2 = 1 - beta2^t (1 without bias_correction) and
    beta3 = 1 - beta1 when grad_averaging else 1:
    L2 mode (adam_w_mode=False): g += wd*p before the moments; m = beta1*m + beta3*g;
    v = beta2*v + (1-beta2)*g^2; u = (m/c1) / (sqrt(v/c2) + eps), plus wd*p in AdamW mode.
    When wd != 0 or use_nvlamb, the step size is lr*||p||/||u|| (lr if either norm is 0), else lr;
    p -= step_size * u.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float = 1.0, use_nvlamb: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"Invalid FusedLAMB hyper-parameter: lr={lr}, eps={eps}, weight_decay={weight_decay} "
                             "(each must be >= 0)")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb

    def _global_grad_norm(self) -> torch.Tensor:
        grads = [p.grad.float() for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return torch.zeros(())
        for grad in grads:
            if grad.is_sparse:
                raise RuntimeError("FusedLAMB does not support sparse gradients.")
        return torch.stack(torch._foreach_norm(grads, 2.0)).norm(2)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        global_norm = self._global_grad_norm()
        for group in self.param_groups:
            self._step_group(group, global_norm)
        return loss

    def _step_group(self, group: dict, global_norm: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        group["step"] = group.get("step", 0) + 1
        step = group["step"]
        c1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
        c2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
        beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
        wd, max_norm = group["weight_decay"], group["max_grad_norm"]
        clip = (global_norm / max_norm).clamp(min=1.0) if max_norm > 0 else torch.ones_like(global_norm)
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.dtype not in (torch.float16, torch.float32, torch.bfloat16):
                raise RuntimeError("FusedLAMB only supports fp16, bf16 and fp32 parameters.")
            state = self.state[param]
            if not state:
                state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            weight = param.float()
            grad = param.grad.float() / clip.to(param.device)
            if not self.adam_w_mode:
                grad = grad + wd * weight
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.mul_(beta1).add_(grad, alpha=beta3)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            update = (exp_avg / c1) / ((exp_avg_sq / c2).sqrt() + group["eps"])
            if self.adam_w_mode:
                update = update + wd * weight
            step_size = torch.tensor(group["lr"], device=param.device)
            if wd != 0 or self.use_nvlamb:
                param_norm, update_norm = weight.norm(2), update.norm(2)
                ratio = torch.where((param_norm > 0) & (update_norm > 0), param_norm / update_norm,
                                    torch.ones_like(param_norm))
                step_size = step_size * ratio
            param.copy_(weight - step_size * update)
