"""``FusedSGD``: apex's SGD (momentum, dampening, Nesterov, weight decay before or after momentum)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from torch.optim.optimizer import required

from apexlite.optimizers import multi_tensor
from apexlite.optimizers._base import ApexStyleOptimizer, check_numbers
from apexlite.optimizers._sgd_rule import sgd_update


class FusedSGD(ApexStyleOptimizer):
    """SGD with apex's constructor; the update matches torch.optim.SGD when wd_after_momentum=False.

    The rule is :mod:`apexlite.optimizers._sgd_rule` (apex's multi_tensor_sgd, also behind
    ``self.multi_tensor_sgd``): fp32 math, buf = g on a param's first step, else
    buf = momentum*buf + (1-dampening)*g; Nesterov or plain momentum; decay before or after momentum.
    Gradients are multiplied by ``1 / most_recent_scale`` (apex's hook for a loss scale; 1 unless set,
    reset to 1 after every step). ``materialize_master_grads`` is accepted for apex compatibility:
    apexlite's O2 always keeps fp32 master grads. ``set_grad_none`` is the default of ``zero_grad``.

    .. note:: **Momentum storage.** ``state[p]["momentum_buffer"]`` has the param's dtype, as apex's
       kernel kept it: an fp16/bf16 param without master weights (O3, or a half model) stores its
       momentum in 2 bytes per element, not 4. The arithmetic is fp32 and the step uses the
       unrounded new momentum; only the stored buffer is rounded, once per step. Under O2 the
       optimizer holds the fp32 masters, so their momentum is fp32.
    """

    def __init__(self, params: Iterable[Any], lr: float = required, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
        check_numbers(type(self).__name__, tensors=True, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                      **({} if lr is required else {"lr": lr}))
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov)
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.set_grad_none = set_grad_none
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        self._make_overflow_buf()
        self.multi_tensor_sgd = multi_tensor.multi_tensor_sgd

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def get_momentums(self, params: List[torch.Tensor]) -> Tuple[List[torch.Tensor], bool]:
        """apex's helper: each param's momentum buffer (created zeroed when missing) and whether the
        last one was just created (apex's ``first_run`` for a list)."""
        momentums, first_run = [], True
        for param in params:
            state = self.state[param]
            first_run = "momentum_buffer" not in state
            if first_run:
                state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            momentums.append(state["momentum_buffer"])
        return momentums, first_run

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("FusedSGD does not support sparse gradients; use torch.optim.SGD.")
            with_momentum = group["momentum"] != 0
            fresh = {id(p) for p in params if with_momentum and "momentum_buffer" not in self.state[p]}
            runs = ((True, [p for p in params if id(p) in fresh]), (False, [p for p in params if id(p) not in fresh]))
            for first_run, subset in runs:
                if not subset:
                    continue
                momenta = self.get_momentums(subset)[0] if with_momentum else [None] * len(subset)
                sgd_update([p.grad for p in subset], subset, momenta, None, weight_decay=group["weight_decay"],
                           momentum=group["momentum"], dampening=group["dampening"], lr=group["lr"],
                           nesterov=group["nesterov"], first_run=first_run,
                           wd_after_momentum=self.wd_after_momentum, scale=1.0 / self.most_recent_scale)
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        return loss
