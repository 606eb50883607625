"""`apex.contrib.optimizers.fused_adam`: the 2019 FusedAdam (also what 2019 scripts got from
`apex.optimizers.FusedAdam`), with `max_grad_norm`, `eps_inside_sqrt` and
`step(grads=, output_params=, scale=, grad_norms=)`.

Its rule (apex's fused_adam_cuda kernel), per tensor, with g = grad / combined_scale:

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
    denom = sqrt(v) + eps          (or sqrt(v + eps) with eps_inside_sqrt)
    p -= step_size * (m/denom + weight_decay*p),   step_size = lr*sqrt(1-b2**t)/(1-b1**t) (lr without
                                                   bias correction)

combined_scale is `scale`, times the clip factor (grad_norm/scale + 1e-6)/max_grad_norm when that
exceeds 1. With eps outside the root this is apexlite's Adam with decoupled decay, with eps and the
decay rescaled per step, so it runs on apexlite's fused Adam step; eps_inside_sqrt is a different
formula and runs on torch ops here.
"""
from __future__ import annotations

import math
import types
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401  (apex's module name)
from apexlite.optimizers._adam_state import is_dense, with_layout
from apexlite.optimizers._adam_step import bump_versions, fused_adam_step
from apexlite.optimizers.multi_tensor.norms import norms_of

Entry = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], dict]


def per_group(values: Any, groups: int) -> List[Any]:
    """apex's reading of step()'s grads / output_params: None, one flat list (one group) or a list per group."""
    if values is None:
        return [None] * groups
    if isinstance(values, types.GeneratorType):
        return [list(values)]
    values = list(values)
    if values and not isinstance(values[0], list):
        return [values]
    return values


class FusedAdam(torch.optim.Optimizer):
    """apex's 2019 FusedAdam (see the module docstring for the rule); runs on CPU and CUDA.

    ``use_mt`` is accepted (every step is fused here). When ``max_grad_norm > 0`` and no ``grad_norms``
    are given, the norm of the group's gradients is computed (apex failed there). Moments are kept in
    float32, so the optimizer also runs directly on an fp16 model.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, eps_inside_sqrt: bool = False,
                 weight_decay: float = 0.0, max_grad_norm: float = 0.0, amsgrad: bool = False, use_mt: bool = False,
                 amp_scale_adjustment: float = 1.0) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.eps_mode = 0 if eps_inside_sqrt else 1
        self._use_multi_tensor = bool(use_mt)
        self._amp_scale_adjustment = amp_scale_adjustment
        if use_mt:
            device = self.param_groups[0]["params"][0].device
            self._overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, grads: Any = None, output_params: Any = None,
             scale: float = 1.0, grad_norms: Optional[Sequence[Any]] = None) -> Any:
        """One step. ``grads``: gradients to use instead of ``p.grad`` (fp16 grads for fp32 params);
        ``output_params``: reduced-precision copies to receive the new weights; ``scale``: what the
        gradients are divided by; ``grad_norms``: per group, the norm of the (scaled) gradients."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stash = getattr(self, "_amp_stash", None)
        if stash is not None and hasattr(stash, "grads"):  # apex's pre-2019 amp handed these over here
            grads, output_params = stash.grads, stash.output_params
            scale, grad_norms = stash.scale * self._amp_scale_adjustment, stash.grad_norms
        groups = len(self.param_groups)
        norms = list(grad_norms) if grad_norms is not None else [None] * groups
        for group, group_grads, group_outputs, norm in zip(
                self.param_groups, per_group(grads, groups), per_group(output_params, groups), norms):
            entries = self._entries(group, group_grads, group_outputs)
            if entries:
                self._step_group(group, entries, self._combined_scale(group, entries, norm, scale))
        return loss

    def _entries(self, group: Dict[str, Any], grads: Optional[List[Any]], outputs: Optional[List[Any]]) -> List[Entry]:
        """(param, grad, output copy, state) for every param with a gradient; initialises state."""
        count = len(group["params"])
        entries = []
        for param, grad, output in zip(group["params"], grads or [None] * count, outputs or [None] * count):
            if param.grad is None and grad is None:
                continue
            grad = param.grad if grad is None else grad
            if grad.is_sparse:
                raise RuntimeError("FusedAdam does not support sparse gradients, please consider SparseAdam instead")
            state = self.state[param]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            state["step"] += 1
            entries.append((param, grad, output, state))
        return entries

    @staticmethod
    def _combined_scale(group: Dict[str, Any], entries: List[Entry], grad_norm: Any, scale: float) -> float:
        """``scale``, times the clip factor when the unscaled gradient norm exceeds ``max_grad_norm``."""
        scale = float(scale)
        if group["max_grad_norm"] <= 0:
            return scale
        if grad_norm is None:
            grad_norm = norms_of([grad for _, grad, _, _ in entries], False)[0]
        grad_norm = float(grad_norm.reshape(-1)[0]) if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        clip = ((grad_norm / scale) + 1e-6) / group["max_grad_norm"]
        return clip * scale if clip > 1 else scale

    def _step_group(self, group: Dict[str, Any], entries: List[Entry], combined_scale: float) -> None:
        update_2019(group, entries, combined_scale, self.eps_mode)


def update_2019(group: Dict[str, Any], entries: List[Entry], combined_scale: float, eps_mode: int) -> None:
    """The 2019 rule (module docstring) on every (param, grad, output copy or None, state) of `entries`;
    `group` holds lr, betas, eps, weight_decay and bias_correction, each state step, exp_avg and exp_avg_sq.
    Also the rule behind apexlite's `fused_adam_cuda` module."""
    buckets: Dict[Tuple, List[Entry]] = defaultdict(list)
    for entry in entries:
        param, grad, output, state = entry
        fused = (eps_mode == 1 and param.dtype is not torch.float64 and is_dense(param)
                 and (output is None or output.stride() == param.stride()))
        key = (state["step"], param.dtype, grad.dtype, None if output is None else output.dtype, fused)
        buckets[key].append(entry)
    for (step, *_, fused), bucket in buckets.items():
        if fused:
            _fused_update(group, bucket, step, combined_scale)
        else:
            for param, grad, output, state in bucket:
                _eps_rule_update(group, param, grad, output, state, step, combined_scale, eps_mode)


def _fused_update(group: Dict[str, Any], bucket: List[Entry], step: int, combined_scale: float) -> None:
    """eps outside the root: apexlite's Adam with eps' = eps/sqrt(c2) and decay' = decay*sqrt(c2)/c1."""
    beta1, beta2 = group["betas"]
    eps, decay = group["eps"], group["weight_decay"]
    if group["bias_correction"]:
        root_c2 = math.sqrt(1 - beta2 ** step)
        eps, decay = eps / root_c2, decay * root_c2 / (1 - beta1 ** step)
    params = [param for param, _, _, _ in bucket]
    pairs = [(param, output) for param, _, output, _ in bucket if output is not None and output is not param]
    narrowing = (len(pairs) == len(bucket) and params[0].dtype == torch.float32
                 and pairs[0][1].dtype in (torch.float16, torch.bfloat16))
    copies = [output for _, output in pairs] if narrowing else []  # written by the fused step itself
    device = params[0].device
    path = fused_adam_step(
        params, [with_layout(grad, param) for param, grad, _, _ in bucket],
        [state["exp_avg"] for *_, state in bucket], [state["exp_avg_sq"] for *_, state in bucket],
        list(torch.full((len(bucket),), float(step - 1), device=device).unbind(0)), copies,
        lr=group["lr"], beta1=beta1, beta2=beta2, eps=eps, weight_decay=decay,
        bias_correction=group["bias_correction"], adam_w_mode=True,
        grad_scale=None if combined_scale == 1.0 else torch.full((1,), combined_scale, device=device))
    if path != "reference":
        bump_versions(params + copies)
    if not narrowing:
        for param, output in pairs:
            output.copy_(param)


def _eps_rule_update(group: Dict[str, Any], param: torch.Tensor, grad: torch.Tensor, output: Optional[torch.Tensor],
                     state: dict, step: int, combined_scale: float, eps_mode: int) -> None:
    """The 2019 rule on torch ops, for eps inside the root (and layouts the fused step does not take), in
    fp32 (float64 params in float64)."""
    beta1, beta2 = group["betas"]
    step_size = group["lr"]
    if group["bias_correction"]:
        step_size = step_size * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
    compute = torch.float64 if param.dtype is torch.float64 else torch.float32
    g = grad.to(compute) / combined_scale
    p = param.to(compute)
    m = state["exp_avg"].mul_(beta1).add_(g, alpha=1 - beta1)
    v = state["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v + group["eps"]).sqrt() if eps_mode == 0 else v.sqrt().add_(group["eps"])
    update = m / denom
    if group["weight_decay"] != 0:
        update.add_(p, alpha=group["weight_decay"])
    p.add_(update, alpha=-step_size)  # the param itself when it is float32
    if p is not param:
        param.copy_(p)
    if output is not None:
        output.copy_(p)
