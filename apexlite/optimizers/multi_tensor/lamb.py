"""apex's LAMB kernels (``multi_tensor_lamb``, the two-stage ``multi_tensor_lamb_stage1_cuda`` /
``multi_tensor_lamb_stage2_cuda`` and the mixed-precision ``multi_tensor_lamb_mp``), all on
apexlite's LAMB rule (:mod:`apexlite.optimizers._lamb_rule`).

As in apex, ``multi_tensor_lamb`` and ``multi_tensor_lamb_mp`` leave each tensor's update direction in
its gradient (list 0) and raise ``noop_flag`` when a param or update norm is inf/NaN. Unlike apex's,
the param update uses the float32 direction, not the one rounded into a half gradient.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from apexlite.optimizers._lamb_rule import (
    LambStep, apply_trust_ratio, bias_corrections, clip_divisor, lamb_directions, lamb_update,
)
from apexlite.optimizers.multi_tensor._lists import (
    Lists, check_float_dtypes, check_lists, noop_is_set, raise_flag_if_non_finite,
)

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
L2_MODE, DECOUPLED_MODE = 0, 1


def _check(lists: List[List[torch.Tensor]], names: Sequence[str], op: str) -> None:
    for name, tensors in zip(names, lists):
        check_float_dtypes(tensors, _FLOATS, name, op)


def _mode(mode: int, op: str) -> bool:
    if mode not in (L2_MODE, DECOUPLED_MODE):
        raise ValueError(f"{op}: mode must be 0 (L2) or 1 (decoupled weight decay); got {mode}.")
    return mode == DECOUPLED_MODE


def _finish(noop_flag: torch.Tensor, grads: Sequence[torch.Tensor], result: LambStep) -> None:
    """apex's side effects: the directions land in the grads; non-finite norms raise the flag."""
    for grad, update in zip(grads, result.updates):
        grad.copy_(update)
    norms = [n.to(noop_flag.device) for n in result.param_norms + result.update_norms]
    raise_flag_if_non_finite(noop_flag, torch.stack(norms))


@torch.no_grad()
def multi_tensor_lamb(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, lr: float, beta1: float,
                      beta2: float, epsilon: float, step: int, bias_correction: int, weight_decay: float,
                      grad_averaging: int, mode: int, global_grad_norm: torch.Tensor, max_grad_norm: float,
                      use_nvlamb: Optional[bool] = False) -> None:
    """LAMB over [grads, params, exp_avgs, exp_avg_sqs]; ``noop_flag`` is not read (apex propagates inf/NaN)."""
    op = "multi_tensor_lamb"
    lists = check_lists(tensor_lists, (4,), op)
    _check(lists, ("grads", "params", "exp_avgs", "exp_avg_sqs"), op)
    result = lamb_update(*lists, lr=lr, beta1=beta1, beta2=beta2, eps=epsilon, step=step,
                         bias_correction=bool(bias_correction), weight_decay=weight_decay,
                         grad_averaging=bool(grad_averaging), adam_w_mode=_mode(mode, op),
                         global_grad_norm=global_grad_norm, max_grad_norm=max_grad_norm,
                         use_nvlamb=bool(use_nvlamb))
    _finish(noop_flag, lists[0], result)


@torch.no_grad()
def multi_tensor_lamb_mp(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, lr: torch.Tensor,
                         beta1: float, beta2: float, epsilon: float, step: torch.Tensor, bias_correction: int,
                         weight_decay: float, grad_averaging: int, mode: int, global_grad_norm: torch.Tensor,
                         max_grad_norm: torch.Tensor, use_nvlamb: Optional[bool], found_inf: torch.Tensor,
                         inv_scale: torch.Tensor) -> None:
    """LAMB over [grads, params, exp_avgs, exp_avg_sqs] (+ [model params] when the params are fp32
    masters), with lr, step, norms and ``inv_scale`` as device tensors. Grads are multiplied by
    ``inv_scale`` and clipped by global_grad_norm / max_grad_norm (both of the scaled grads). Skips
    everything while ``noop_flag`` is raised; ``found_inf`` is accepted and unread, as in apex."""
    op = "multi_tensor_lamb_mp"
    lists = check_lists(tensor_lists, (4, 5), op)
    _check(lists, ("grads", "params", "exp_avgs", "exp_avg_sqs", "model params"), op)
    if len(lists) == 5:
        check_float_dtypes(lists[1], (torch.float32,), "params (fp32 masters when 5 lists are given)", op)
    if noop_is_set(noop_flag):
        return
    result = lamb_update(*lists[:4], lists[4] if len(lists) == 5 else None, lr=lr, beta1=beta1, beta2=beta2,
                         eps=epsilon, step=step, bias_correction=bool(bias_correction), weight_decay=weight_decay,
                         grad_averaging=bool(grad_averaging), adam_w_mode=_mode(mode, op),
                         global_grad_norm=global_grad_norm, max_grad_norm=max_grad_norm,
                         use_nvlamb=bool(use_nvlamb), inv_scale=inv_scale.reshape(()).float())
    _finish(noop_flag, lists[0], result)


@torch.no_grad()
def multi_tensor_lamb_stage1_cuda(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                                  per_tensor_decay: torch.Tensor, step: int, beta1: float, beta2: float,
                                  epsilon: float, global_grad_norm: torch.Tensor,
                                  max_global_grad_norm: float) -> None:
    """The first LAMB stage of apex's 2019 two-kernel LAMB, over [grads, params, exp_avgs, exp_avg_sqs,
    updates]: ``step`` is the count before this step (step + 1 is used), bias correction and grad
    averaging are always on, decay is decoupled and per tensor (``per_tensor_decay[i]``). The
    direction of each tensor is written into ``updates``."""
    op = "multi_tensor_lamb_stage1_cuda"
    grads, params, exp_avgs, exp_avg_sqs, updates = check_lists(tensor_lists, (5,), op)
    _check([grads, params, exp_avgs, exp_avg_sqs, updates],
           ("grads", "params", "exp_avgs", "exp_avg_sqs", "updates"), op)
    if per_tensor_decay.numel() < len(params):
        raise ValueError(f"{op}: per_tensor_decay has {per_tensor_decay.numel()} values for {len(params)} tensors.")
    c1, c2 = bias_corrections(beta1, beta2, step + 1, True)
    decays = list(per_tensor_decay.detach().float().reshape(-1).unbind(0))[:len(params)]
    directions = lamb_directions(
        grads, params, exp_avgs, exp_avg_sqs, beta1=beta1, beta2=beta2, beta3=1 - beta1,
        bias_correction1=c1, bias_correction2=c2, eps=epsilon, weight_decays=decays, adam_w_mode=True,
        grad_divisor=clip_divisor(global_grad_norm, max_global_grad_norm))
    for out, direction in zip(updates, directions):
        out.copy_(direction)


@torch.no_grad()
def multi_tensor_lamb_stage2_cuda(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                                  per_tensor_param_norm: torch.Tensor, per_tensor_update_norm: torch.Tensor,
                                  lr: float, weight_decay: float, use_nvlamb: Optional[bool] = False) -> None:
    """The second LAMB stage over [params, updates]: p -= ratio * u with the trust ratio made from
    ``per_tensor_param_norm[i]`` and ``per_tensor_update_norm[i]`` (see the rule)."""
    op = "multi_tensor_lamb_stage2_cuda"
    params, updates = check_lists(tensor_lists, (2,), op)
    _check([params, updates], ("params", "updates"), op)
    for name, norms in (("per_tensor_param_norm", per_tensor_param_norm),
                        ("per_tensor_update_norm", per_tensor_update_norm)):
        if norms.numel() < len(params):
            raise ValueError(f"{op}: {name} has {norms.numel()} values for {len(params)} tensors.")
    apply_trust_ratio(params, updates, lr=lr, weight_decay=weight_decay, use_nvlamb=bool(use_nvlamb),
                      param_norms=list(per_tensor_param_norm.float().reshape(-1).unbind(0)),
                      update_norms=list(per_tensor_update_norm.float().reshape(-1).unbind(0)))
