"""``FusedAdagrad``: apex's Adagrad, with optional decoupled weight decay (``adagrad_w_mode``)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from apexlite.optimizers import multi_tensor
from apexlite.optimizers._adagrad_rule import DECOUPLED_MODE, L2_MODE, adagrad_update
from apexlite.optimizers._base import ApexStyleOptimizer, check_numbers


class FusedAdagrad(ApexStyleOptimizer):
    """Adagrad with apex's constructor; matches torch.optim.Adagrad (lr_decay=0) when adagrad_w_mode=False.

    The rule is :mod:`apexlite.optimizers._adagrad_rule` (apex's multi_tensor_adagrad, also behind
    ``self.multi_tensor_adagrad``). The state ``sum`` is kept in fp32 whatever the param dtype (apex
    kept it in the param's dtype, where fp16 sums of squares overflow).
    """

    float32_state = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, eps: float = 1e-10, weight_decay: float = 0.0,
                 set_grad_none: bool = True, adagrad_w_mode: bool = False) -> None:
        check_numbers(type(self).__name__, tensors=True, lr=lr, eps=eps, weight_decay=weight_decay)
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))
        self.adagrad_w_mode = 1 if adagrad_w_mode else 0
        self.set_grad_none = set_grad_none
        self._make_overflow_buf()
        self.multi_tensor_adagrad = multi_tensor.multi_tensor_adagrad

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("FusedAdagrad does not support sparse gradients; use torch.optim.Adagrad.")
            for param in params:
                if "sum" not in self.state[param]:
                    self.state[param]["sum"] = torch.zeros_like(param, dtype=torch.float32,
                                                                memory_format=torch.preserve_format)
            adagrad_update([p.grad for p in params], params, [self.state[p]["sum"] for p in params],
                           lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"],
                           mode=DECOUPLED_MODE if self.adagrad_w_mode else L2_MODE)
        return loss
