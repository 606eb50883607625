"""`fused_adam_cuda`: the Adam kernels of apex's 2019 FusedAdam (built by apex's `--deprecated_fused_adam`).

fairseq's FusedAdamV1 probes for this module and calls `adam` once per parameter; apex's own 2019
FusedAdam called `adam` or, with `use_mt`, `adam_mt`. Both run the 2019 rule of
apexlite.compat.apex.contrib.optimizers.fused_adam (the same code as apexlite's 2019 FusedAdam), in
place, with apex's arguments:

    adam(p, p_copy, m, v, g, lr, beta1, beta2, eps, grad_scale, step, mode, bias_correction, decay)
    adam_mt(chunk_size, overflow_flag, [ps, ms, vs, gs(, p_copies)], lr, beta1, beta2, eps, grad_scale,
            step, mode, bias_correction, decay)

g is divided by grad_scale; `mode` 0 puts eps inside the square root, 1 outside; `bias_correction` 1
corrects the step size; `decay` is added to the update as decay * p. With half (or bfloat16) grads the
param and moments must be float32 and `p_copy`, when not empty, receives the new param in the grad's
dtype (`adam` writes no copy for float32 grads, as apex's kernel did; `adam_mt` writes the fifth list
whenever it is given). `chunk_size` and `overflow_flag` are accepted and unused, as in apex's kernel.

apex's module also had the kernels of its pre-2020 DistributedFusedAdam (reversible_adam,
maybe_adam_undo, strided_check_finite, maybe_cast, maybe_cast_mt): they are importable and raise
ApexliteUnsupportedError when called, naming the alternative (apexlite's tree table has the note).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from apexlite.compat import generic
from apexlite.compat.apex.contrib.optimizers.fused_adam import update_2019

Tensor = torch.Tensor
_HALF_GRADS = (torch.float16, torch.bfloat16)

__all__ = ["adam", "adam_mt"]
__getattr__ = generic.fallback_getattr(__name__)


def _check_dtypes(param: Tensor, grad: Tensor, function: str) -> None:
    if grad.dtype in _HALF_GRADS and param.dtype is not torch.float32:
        raise RuntimeError(f"fused_adam_cuda.{function}: with {grad.dtype} gradients the parameter (and moments) "
                           f"must be float32 (the master copy), got {param.dtype}.")
    if grad.dtype not in _HALF_GRADS and grad.dtype != param.dtype:
        raise RuntimeError(f"fused_adam_cuda.{function}: {grad.dtype} gradients need {grad.dtype} parameters, "
                           f"got {param.dtype}.")
    if grad.numel() != param.numel():
        raise RuntimeError(f"fused_adam_cuda.{function}: number of elements in g ({grad.numel()}) and p "
                           f"({param.numel()}) tensors should be equal")


def _update(entries: List[tuple], lr: float, beta1: float, beta2: float, eps: float, grad_scale: float, mode: int,
            bias_correction: int, decay: float) -> None:
    if mode not in (0, 1):
        raise ValueError(f"fused_adam_cuda: mode must be 0 (eps inside the square root) or 1 (outside); got {mode}.")
    group = {"lr": lr, "betas": (beta1, beta2), "eps": eps, "weight_decay": decay,
             "bias_correction": bias_correction == 1}
    with torch.no_grad():
        update_2019(group, entries, float(grad_scale), mode)


def _state(m: Tensor, v: Tensor, param: Tensor, step: int, function: str) -> dict:
    for name, moment in (("m", m), ("v", v)):
        if moment.shape != param.shape or moment.dtype != param.dtype:
            raise RuntimeError(f"fused_adam_cuda.{function}: {name} must match p in shape and dtype "
                               f"({list(param.shape)}, {param.dtype}); got {list(moment.shape)}, {moment.dtype}.")
    return {"step": int(step), "exp_avg": m, "exp_avg_sq": v}


def adam(p: Tensor, p_copy: Tensor, m: Tensor, v: Tensor, g: Tensor, lr: float, beta1: float, beta2: float,
         eps: float, grad_scale: float, step: int, mode: int, bias_correction: int, decay: float) -> None:
    """One Adam step on `p`, `m`, `v` in place; with half grads, `p_copy` (unless empty) gets the new p."""
    _check_dtypes(p, g, "adam")
    copy: Optional[Tensor] = p_copy if g.dtype in _HALF_GRADS and p_copy.numel() else None
    if copy is not None and copy.shape != p.shape:
        raise RuntimeError("fused_adam_cuda.adam: number of elements in p_copy and p tensors should be equal, or "
                           "p_copy should be empty")
    _update([(p, g.reshape(p.shape), copy, _state(m, v, p, step, "adam"))], lr, beta1, beta2, eps, grad_scale, mode,
            bias_correction, decay)


def adam_mt(chunk_size: int, overflow_flag: Tensor, tensor_lists: Sequence[Sequence[Tensor]], lr: float,
            beta1: float, beta2: float, eps: float, grad_scale: float, step: int, mode: int, bias_correction: int,
            decay: float) -> None:
    """adam over lists [params, exp_avgs, exp_avg_sqs, grads] (+ [param copies], always written)."""
    if len(tensor_lists) not in (4, 5) or len({len(tensors) for tensors in tensor_lists}) != 1:
        raise RuntimeError("fused_adam_cuda.adam_mt: expected 4 or 5 tensor lists of equal length "
                           "([params, exp_avgs, exp_avg_sqs, grads] and optionally [param copies])")
    params, exp_avgs, exp_avg_sqs, grads = (list(tensors) for tensors in tensor_lists[:4])
    copies = list(tensor_lists[4]) if len(tensor_lists) == 5 else [None] * len(params)
    entries = []
    for param, m, v, grad, copy in zip(params, exp_avgs, exp_avg_sqs, grads, copies):
        _check_dtypes(param, grad, "adam_mt")
        entries.append((param, grad.reshape(param.shape), copy, _state(m, v, param, step, "adam_mt")))
    _update(entries, lr, beta1, beta2, eps, grad_scale, mode, bias_correction, decay)
