"""``FusedNovoGrad``: apex's NovoGrad (per-tensor second moment built from the gradient norm)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Tuple

import torch

from apexlite.optimizers._base import ApexStyleOptimizer


class FusedNovoGrad(ApexStyleOptimizer):
    """NovoGrad with apex's constructor and update rule (fp32 math and state).

    Per tensor, n = ||g|| (L2 for norm_type=2, max-abs for norm_type=0). The second moment is one
    number per tensor: v = sqrt(beta2*v^2 + (1-beta2)*n^2) for L2 (max(beta2*v, (1-beta2)*n) for
    max-abs); on the first step v starts at 0 with ``init_zero`` and at n otherwise. With
    c1 = 1-beta1^t, c2 = sqrt(1-beta2^t) (both 1 without bias_correction), beta3 = 1-beta1 when
    grad_averaging else 1, and d = v/c2 + eps:
    reg_inside_moment: m = beta1*m + beta3*(g/d + wd*p); p -= lr*m/c1.
    otherwise:         m = beta1*m + beta3*g;           p -= lr*(m/c1/d + wd*p).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, reg_inside_moment: bool = False, grad_averaging: bool = True,
                 norm_type: int = 2, init_zero: bool = False, set_grad_none: bool = True) -> None:
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        if norm_type not in (0, 2):
            raise RuntimeError(f"FusedNovoGrad supports norm_type 2 (L2) and 0 (max-abs); got {norm_type}.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging, norm_type=norm_type,
                        init_zero=init_zero)
        super().__init__(params, defaults)
        self.moment_mode = 0 if reg_inside_moment else 1
        self.set_grad_none = set_grad_none

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for param in group["params"]:
                if param.grad is not None:
                    if param.grad.is_sparse:
                        raise RuntimeError("FusedNovoGrad does not support sparse gradients.")
                    self._update(param, group)
        return loss

    def _blend_norm(self, state: dict, grad: torch.Tensor, group: dict) -> torch.Tensor:
        beta2 = group["betas"][1]
        if group["norm_type"] == 2:
            norm = grad.norm(2)
            if "exp_avg_sq" not in state:
                state["exp_avg_sq"] = torch.zeros_like(norm) if group["init_zero"] else norm.clone()
            state["exp_avg_sq"] = (beta2 * state["exp_avg_sq"] ** 2 + (1 - beta2) * norm ** 2).sqrt()
        else:
            norm = grad.abs().max()
            if "exp_avg_sq" not in state:
                state["exp_avg_sq"] = torch.zeros_like(norm) if group["init_zero"] else norm.clone()
            state["exp_avg_sq"] = torch.maximum(beta2 * state["exp_avg_sq"], (1 - beta2) * norm)
        return state["exp_avg_sq"]

    def _update(self, param: torch.Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        step, lr, wd = group["step"], group["lr"], group["weight_decay"]
        c1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
        c2 = (1 - beta2 ** step) ** 0.5 if group["bias_correction"] else 1.0
        beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
        state = self.state[param]
        grad, weight = param.grad.float(), param.float()
        denom = self._blend_norm(state, grad, group) / c2 + group["eps"]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(weight)
        exp_avg = state["exp_avg"]
        if self.moment_mode == 0:
            exp_avg.mul_(beta1).add_(grad / denom + wd * weight, alpha=beta3)
            weight = weight - lr * exp_avg / c1
        else:
            exp_avg.mul_(beta1).add_(grad, alpha=beta3)
            weight = weight - lr * (exp_avg / c1 / denom + wd * weight)
        param.copy_(weight)
