"""``FusedSGD``: apex's SGD (momentum, dampening, Nesterov, weight decay before or after momentum)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
from torch.optim.optimizer import required

from apexlite.optimizers._base import ApexStyleOptimizer


class FusedSGD(ApexStyleOptimizer):
    """SGD with apex's constructor; the update matches torch.optim.SGD when wd_after_momentum=False.

    Per param, with gradient g (computed in fp32, written back in the param's dtype):
    g += wd*p (before momentum, or after it when ``wd_after_momentum``); buf = g on the first step,
    else buf = momentum*buf + (1-dampening)*g; g = g + momentum*buf (Nesterov) or g = buf; p -= lr*g.
    ``materialize_master_grads`` is accepted for apex compatibility: apexlite's O2 always keeps fp32
    master grads. ``set_grad_none`` is the default of ``zero_grad``.

    .. note:: **Momentum storage.** ``state[p]["momentum_buffer"]`` has the param's dtype, as apex's
       kernel kept it: an fp16/bf16 param without master weights (O3, or a half model) stores its
       momentum in 2 bytes per element, not 4. The arithmetic is fp32 and the step uses the
       unrounded new momentum; only the stored buffer is rounded, once per step. Under O2 the
       optimizer holds the fp32 masters, so their momentum is fp32.
    """

    def __init__(self, params: Iterable[Any], lr: float = required, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
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

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("FusedSGD does not support sparse gradients; use torch.optim.SGD.")
                grad = param.grad.float()
                weight = param.float()
                if wd != 0 and not self.wd_after_momentum:
                    grad = grad.add(weight, alpha=wd)
                if momentum != 0:
                    buf = self._update_momentum(param, grad, momentum, group["dampening"])
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                if wd != 0 and self.wd_after_momentum:
                    grad = grad.add(weight, alpha=wd)
                param.copy_(weight.add_(grad, alpha=-group["lr"]))
        return loss

    def _update_momentum(self, param: torch.Tensor, grad: torch.Tensor, momentum: float,
                         dampening: float) -> torch.Tensor:
        """The new fp32 momentum (the grad on the first step); stores it rounded to the param's dtype."""
        state = self.state[param]
        stored = state.get("momentum_buffer")
        if stored is None:
            buf = grad.clone()
            state["momentum_buffer"] = buf.to(param.dtype)
            return buf
        buf = stored.float().mul_(momentum).add_(grad, alpha=1 - dampening)  # in place when stored is fp32
        if buf is not stored:
            stored.copy_(buf)
        return buf
