"""``FusedLAMB``: apex's LAMB (Adam moments, global grad-norm clipping, per-tensor trust ratio)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.optimizers import multi_tensor
from apexlite.optimizers._base import ApexStyleOptimizer, check_hyper, check_numbers
from apexlite.optimizers._lamb_rule import lamb_update

_SUPPORTED = (torch.float16, torch.float32, torch.bfloat16)


_log = get_logger("optimizers")


class FusedLAMB(ApexStyleOptimizer):
    """LAMB with apex's constructor and update rule (fp32 math and state; params may be fp16/bf16).

    The rule is :mod:`apexlite.optimizers._lamb_rule` (apex's multi_tensor_lamb, also behind
    ``self.multi_tensor_lamb``): the L2 norm G of all gradients (over every group) is computed
    (``self.multi_tensor_l2norm``); when ``max_grad_norm > 0`` (the constructor's, for every group, as in
    apex) and G exceeds it, gradients are divided by G / max_grad_norm. Then per param, with c1 = 1 - beta1^t and c2 = 1 - beta2^t (1
    without bias_correction) and beta3 = 1 - beta1 when grad_averaging else 1:
    L2 mode (adam_w_mode=False): g += wd*p before the moments; m = beta1*m + beta3*g;
    v = beta2*v + (1-beta2)*g^2; u = (m/c1) / (sqrt(v/c2) + eps), plus wd*p in AdamW mode.
    When wd != 0 or use_nvlamb, the step size is lr*||p||/||u|| (lr if either norm is 0), else lr;
    p -= step_size * u. Unlike apex's kernel, the gradients are left as they are (apex's held the
    update direction afterwards), and the moments are fp32 for fp16/bf16 params.
    """

    float32_state = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float = 1.0, use_nvlamb: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        check_hyper(lr, betas, eps, weight_decay, owner=type(self).__name__)
        check_numbers(type(self).__name__, max_grad_norm=max_grad_norm)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb
        self._make_overflow_buf()
        self.multi_tensor_l2norm = multi_tensor.multi_tensor_l2norm
        self.multi_tensor_lamb = multi_tensor.multi_tensor_lamb

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's, with a word for a group that sets its own max_grad_norm: all groups' gradients are clipped
        together, at ``defaults["max_grad_norm"]`` (as apex read it), so a group's own value is not used."""
        given = param_group.get("max_grad_norm", self.defaults["max_grad_norm"])
        if given != self.defaults["max_grad_norm"]:
            _log.warning("%s: param group %d sets max_grad_norm=%r, which is not used: the gradients of all groups "
                         "are clipped together at the constructor's max_grad_norm=%r (optimizer.defaults"
                         "['max_grad_norm']), as in apex", type(self).__name__, len(self.param_groups), given,
                         self.defaults["max_grad_norm"])
        super().add_param_group(param_group)

    def _params_with_grads(self, group: Dict[str, Any]) -> List[torch.Tensor]:
        params = [p for p in group["params"] if p.grad is not None]
        for param in params:
            if param.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients.")
            if param.dtype not in _SUPPORTED:
                raise RuntimeError(f"{type(self).__name__} supports fp16, bf16 and fp32 parameters; got {param.dtype}.")
        return params

    def _global_grad_norm(self) -> torch.Tensor:
        grads = [p.grad for group in self.param_groups for p in self._params_with_grads(group)]
        if not grads:
            return torch.zeros(())
        return multi_tensor.norms.norms_of(grads, False)[0].reshape(())

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        global_norm = self._global_grad_norm()
        for group in self.param_groups:
            params = self._params_with_grads(group)
            group["step"] = group.get("step", 0) + 1
            if not params:
                continue
            for param in params:
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            beta1, beta2 = group["betas"]
            lamb_update([p.grad for p in params], params, [self.state[p]["exp_avg"] for p in params],
                        [self.state[p]["exp_avg_sq"] for p in params], lr=group["lr"], beta1=beta1, beta2=beta2,
                        eps=group["eps"], step=group["step"], bias_correction=group["bias_correction"],
                        weight_decay=group["weight_decay"], grad_averaging=group["grad_averaging"],
                        adam_w_mode=bool(self.adam_w_mode), global_grad_norm=global_norm,
                        max_grad_norm=self.defaults["max_grad_norm"], use_nvlamb=self.use_nvlamb)
        return loss
