"""``FusedNovoGrad``: apex's NovoGrad (per-tensor second moment built from the gradient norm)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from apexlite.optimizers import multi_tensor
from apexlite.optimizers._base import ApexStyleOptimizer, check_hyper
from apexlite.optimizers._novograd_rule import DECOUPLED_MODE, INSIDE_MOMENT_MODE, novograd_update

_REDUCED = (torch.float16, torch.bfloat16)


class FusedNovoGrad(ApexStyleOptimizer):
    """NovoGrad with apex's constructor, update rule and state layout.

    The rule is :mod:`apexlite.optimizers._novograd_rule` (apex's multi_tensor_novograd, also behind
    ``self.multi_tensor_novograd``). As in apex, the per-tensor second moments (norms, not squares)
    live in the param group: ``group["exp_avg_sq"] = [norms of the fp16/bf16 params, norms of the fp32
    params]``, float32 tensors in param order; without ``init_zero`` they start at the first step's
    gradient norms, so the first blend leaves them unchanged. ``state[p]["exp_avg"]`` is kept in fp32.
    bfloat16 params share the first slot with fp16 ones (apex rejected bfloat16).
    """

    float32_state = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, reg_inside_moment: bool = False, grad_averaging: bool = True,
                 norm_type: int = 2, init_zero: bool = False, set_grad_none: bool = True) -> None:
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        if norm_type not in (0, 2):
            raise RuntimeError(f"FusedNovoGrad supports norm_type 2 (L2) and 0 (max-abs); got {norm_type}.")
        check_hyper(lr, betas, eps, weight_decay, owner="FusedNovoGrad")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging, norm_type=norm_type,
                        init_zero=init_zero)
        super().__init__(params, defaults)
        self.moment_mode = INSIDE_MOMENT_MODE if reg_inside_moment else DECOUPLED_MODE
        self.set_grad_none = set_grad_none
        self._make_overflow_buf()
        self.multi_tensor_novograd = multi_tensor.multi_tensor_novograd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's loading, then the group norms moved to the params' device (as apex does)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            if group["params"] and "exp_avg_sq" in group:
                device = group["params"][0].device
                group["exp_avg_sq"] = [None if t is None else t.to(device) for t in group["exp_avg_sq"]]

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for param in params:
                if param.grad.is_sparse:
                    raise RuntimeError("FusedNovoGrad does not support sparse gradients.")
                if param.dtype not in _REDUCED + (torch.float32,):
                    raise RuntimeError(f"FusedNovoGrad supports fp16, bf16 and fp32 params; got {param.dtype}.")
                if "exp_avg" not in self.state[param]:
                    self.state[param]["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            slots = ([p for p in params if p.dtype in _REDUCED], [p for p in params if p.dtype == torch.float32])
            norms = self._group_norms(group, slots)
            group["step"] = group.get("step", 0) + 1
            for slot_params, slot_norms in zip(slots, norms):
                if slot_params:
                    self._update(group, slot_params, slot_norms)
        return loss

    def _group_norms(self, group: Dict[str, Any], slots: Tuple[List[torch.Tensor], ...]) -> List[torch.Tensor]:
        """apex's ``group["exp_avg_sq"]``, made at the first step; its sizes must match the params with grads."""
        if "exp_avg_sq" not in group:
            group["exp_avg_sq"] = [self._initial_norms(group, slot) for slot in slots]
        for name, slot, norms in zip(("fp16/bf16", "fp32"), slots, group["exp_avg_sq"]):
            if norms is None or norms.numel() != len(slot):
                size = "none" if norms is None else norms.numel()
                raise RuntimeError(
                    f"FusedNovoGrad keeps one norm per {name} param with a gradient in each group ({size} "
                    f"stored, {len(slot)} params with grads now); NovoGrad needs the same params to receive "
                    "gradients at every step (set requires_grad=False on the others before the first step).")
        return group["exp_avg_sq"]

    @staticmethod
    def _initial_norms(group: Dict[str, Any], params: List[torch.Tensor]) -> torch.Tensor:
        device = params[0].device if params else group["params"][0].device
        if group["init_zero"] or not params:
            return torch.zeros(len(params), dtype=torch.float32, device=device)
        order = 2.0 if group["norm_type"] == 2 else float("inf")
        return torch.stack(torch._foreach_norm([p.grad.float() for p in params], order)).to(device)

    def _update(self, group: Dict[str, Any], params: List[torch.Tensor], norms: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        novograd_update([p.grad for p in params], params, [self.state[p]["exp_avg"] for p in params], norms,
                        lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"], step=group["step"],
                        bias_correction=group["bias_correction"], weight_decay=group["weight_decay"],
                        grad_averaging=group["grad_averaging"], moment_mode=self.moment_mode,
                        norm_type=group["norm_type"])
