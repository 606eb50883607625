"""``FusedAdagrad``: apex's Adagrad, with optional decoupled weight decay (``adagrad_w_mode``)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from apexlite.optimizers._base import ApexStyleOptimizer


class FusedAdagrad(ApexStyleOptimizer):
    """Adagrad with apex's constructor; matches torch.optim.Adagrad (lr_decay=0) when adagrad_w_mode=False.

    Per param (fp32 math, state ``sum`` in fp32): L2 mode: g += wd*p; sum += g*g;
    p -= lr * g / (sqrt(sum) + eps). Decoupled mode: sum += g*g; p -= lr * (g / (sqrt(sum) + eps) + wd*p).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, eps: float = 1e-10, weight_decay: float = 0.0,
                 set_grad_none: bool = True, adagrad_w_mode: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))
        self.adagrad_w_mode = adagrad_w_mode
        self.set_grad_none = set_grad_none

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedAdagrad does not support sparse gradients; use torch.optim.Adagrad.")
                state = self.state[param]
                if "sum" not in state:
                    state["sum"] = torch.zeros_like(param, dtype=torch.float32, memory_format=torch.preserve_format)
                grad, weight, accumulator = param.grad.float(), param.float(), state["sum"]
                if self.adagrad_w_mode:
                    accumulator.addcmul_(grad, grad)
                    update = grad / (accumulator.sqrt() + eps) + wd * weight
                else:
                    grad = grad.add(weight, alpha=wd)
                    accumulator.addcmul_(grad, grad)
                    update = grad / (accumulator.sqrt() + eps)
                param.copy_(weight.add_(update, alpha=-lr))
        return loss
