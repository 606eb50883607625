"""apex's Adam kernels (``multi_tensor_adam``, ``_capturable``, ``_capturable_master``) on apexlite's one
Adam formula: each call goes through :func:`apexlite.optimizers._adam_step.fused_adam_step`, so it runs
apexlite's compiled kernel (``csrc/include/apexlite/adam_math.h``), torch's fused Adam ops, or the
pure-torch reference, exactly as ``FusedAdam`` does.

Tensor lists follow apex: [grads, params, exp_avgs, exp_avg_sqs] (+ [fp32 masters]). Mode 0 is Adam
with L2 decay, mode 1 is AdamW. Results agree with apex's kernels to float32 rounding (apexlite divides
sqrt(v) by sqrt(1 - beta2**t) where apex takes sqrt(v / (1 - beta2**t)), and applies decoupled decay
as p * (1 - lr*wd)).

- ``multi_tensor_adam``: ``step`` is the count of this step (1 on the first); ``noop_flag`` is neither
  read nor set (apex's kernel lets inf/NaN through). Grads are left as they are.
- the capturable variants take ``lr`` and ``step`` (int) as tensors and ``inv_scale``; they skip the
  whole call while ``noop_flag`` is raised (on the device) and store the unscaled gradients back into
  the grads. apexlite reads ``lr`` on the host, so they cannot run inside a CUDA graph capture.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from apexlite.optimizers._adam_state import is_dense
from apexlite.optimizers._adam_step import bump_versions, fused_adam_step
from apexlite.optimizers._grad_writeback import check_grads_writable
from apexlite.optimizers.multi_tensor._lists import Lists, check_float_dtypes, check_lists, to_float

_READABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_FUSED = (torch.float32, torch.float16, torch.bfloat16)
_HALVES = (torch.float16, torch.bfloat16)
L2_MODE, DECOUPLED_MODE = 0, 1


def _fused_ok(param: torch.Tensor, others: Sequence[torch.Tensor], moment: torch.Tensor,
              copy: Optional[torch.Tensor]) -> bool:
    """Whether one tensor's entries fit the fused paths (dtypes and a shared dense layout)."""
    if param.dtype not in _FUSED or any(t.dtype not in _FUSED for t in others):
        return False
    if moment.dtype not in (torch.float32, torch.bfloat16):
        return False
    if copy is not None and (param.dtype != torch.float32 or copy.dtype not in _HALVES):
        return False
    return is_dense(param) and all(t.stride() == param.stride() for t in others if t.numel() > 1)


def _step_counters(step: torch.Tensor, count: int) -> List[torch.Tensor]:
    """``count`` float32 counters holding step - 1 (the fused step adds one), without a host sync."""
    previous = step.detach().reshape(()).to(torch.float32) - 1
    return list(previous.expand(count).clone().unbind(0))


def _run(grads: List[torch.Tensor], params: List[torch.Tensor], exp_avgs: List[torch.Tensor],
         exp_avg_sqs: List[torch.Tensor], copies: Optional[List[torch.Tensor]], step: torch.Tensor, *,
         lr: float, beta1: float, beta2: float, eps: float, mode: int, bias_correction: int, weight_decay: float,
         grad_scale: Optional[torch.Tensor] = None, found_inf: Optional[torch.Tensor] = None, op: str) -> None:
    """Files the tensors into buckets of one dtype combination each and steps every bucket."""
    if mode not in (L2_MODE, DECOUPLED_MODE):
        raise ValueError(f"{op}: mode must be 0 (Adam with L2 decay) or 1 (AdamW); got {mode}.")
    if grad_scale is not None:  # the unscaled grads are stored back in place
        check_grads_writable(zip(params, grads), op)
    buckets: Dict[Tuple, List[int]] = defaultdict(list)
    for i, (g, p, m, v) in enumerate(zip(grads, params, exp_avgs, exp_avg_sqs)):
        copy = copies[i] if copies else None
        key = (p.dtype, g.dtype, m.dtype, v.dtype, copy.dtype if copy is not None else None,
               m.dtype == v.dtype and _fused_ok(p, [g, m, v] + ([copy] if copy is not None else []), m, copy))
        buckets[key].append(i)
    for key, indices in buckets.items():
        pick = lambda tensors: [tensors[i] for i in indices]  # noqa: E731
        bucket_params, bucket_copies = pick(params), pick(copies) if copies else []
        path = fused_adam_step(
            bucket_params, pick(grads), pick(exp_avgs), pick(exp_avg_sqs), _step_counters(step, len(indices)),
            bucket_copies, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            bias_correction=bool(bias_correction), adam_w_mode=mode == DECOUPLED_MODE,
            grad_scale=grad_scale, found_inf=found_inf, unscale_grads=grad_scale is not None,
            implementation="auto" if key[-1] else "reference")
        if path != "reference":
            bump_versions(bucket_params + bucket_copies)


def _check(lists: List[List[torch.Tensor]], op: str) -> None:
    for name, tensors in zip(("grads", "params", "exp_avgs", "exp_avg_sqs", "master params"), lists):
        check_float_dtypes(tensors, _READABLE, name, op)


@torch.no_grad()
def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, lr: float, beta1: float,
                      beta2: float, epsilon: float, step: int, mode: int, bias_correction: int,
                      weight_decay: float) -> None:
    """One Adam/AdamW step over [grads, params, exp_avgs, exp_avg_sqs] (see the module docstring)."""
    op = "multi_tensor_adam"
    lists = check_lists(tensor_lists, (4,), op)
    _check(lists, op)
    device = lists[1][0].device
    _run(*lists, None, torch.full((), float(step), device=device), lr=to_float(lr), beta1=beta1, beta2=beta2,
         eps=epsilon, mode=mode, bias_correction=bias_correction, weight_decay=weight_decay, op=op)


def _scaling(noop_flag: torch.Tensor, inv_scale: torch.Tensor, device: torch.device):
    """(loss scale, found_inf) as the 1-element float32 device tensors the fused step takes."""
    found_inf = (noop_flag.reshape(-1)[:1] != 0).to(device=device, dtype=torch.float32)
    grad_scale = inv_scale.detach().reshape(-1)[:1].to(device=device, dtype=torch.float64).reciprocal().float()
    return grad_scale, found_inf


@torch.no_grad()
def multi_tensor_adam_capturable(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, lr: torch.Tensor,
                                 beta1: float, beta2: float, epsilon: float, step: torch.Tensor, mode: int,
                                 bias_correction: int, weight_decay: float, inv_scale: torch.Tensor) -> None:
    """Adam/AdamW over [grads, params, exp_avgs, exp_avg_sqs] with grads multiplied by ``inv_scale``."""
    op = "multi_tensor_adam_capturable"
    lists = check_lists(tensor_lists, (4,), op)
    _check(lists, op)
    grad_scale, found_inf = _scaling(noop_flag, inv_scale, lists[1][0].device)
    _run(*lists, None, step, lr=to_float(lr), beta1=beta1, beta2=beta2, eps=epsilon, mode=mode,
         bias_correction=bias_correction, weight_decay=weight_decay, grad_scale=grad_scale, found_inf=found_inf,
         op=op)


@torch.no_grad()
def multi_tensor_adam_capturable_master(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                                        lr: torch.Tensor, beta1: float, beta2: float, epsilon: float,
                                        step: torch.Tensor, mode: int, bias_correction: int, weight_decay: float,
                                        inv_scale: torch.Tensor) -> None:
    """As the capturable kernel over [grads, params, exp_avgs, exp_avg_sqs, fp32 masters]: the math runs
    on the masters and each param receives its master's new value (rounded to the param's dtype)."""
    op = "multi_tensor_adam_capturable_master"
    grads, params, exp_avgs, exp_avg_sqs, masters = check_lists(tensor_lists, (5,), op)
    _check([grads, params, exp_avgs, exp_avg_sqs, masters], op)
    check_float_dtypes(masters, (torch.float32,), "master params", op)
    grad_scale, found_inf = _scaling(noop_flag, inv_scale, params[0].device)
    half = [i for i, p in enumerate(params) if p.dtype != torch.float32]
    full = [i for i, p in enumerate(params) if p.dtype == torch.float32]
    hyper = dict(lr=to_float(lr), beta1=beta1, beta2=beta2, eps=epsilon, mode=mode, bias_correction=bias_correction,
                 weight_decay=weight_decay, grad_scale=grad_scale, found_inf=found_inf, op=op)
    for indices, with_copies in ((half, True), (full, False)):
        if not indices:
            continue
        pick = lambda tensors: [tensors[i] for i in indices]  # noqa: E731
        _run(pick(grads), pick(masters), pick(exp_avgs), pick(exp_avg_sqs), pick(params) if with_copies else None,
             step, **hyper)
        if not with_copies:  # float32 params: a copy kernel cannot narrow, so take the masters' values here
            with torch.no_grad():
                for param, master in zip(pick(params), pick(masters)):
                    param.copy_(torch.where(found_inf.to(param.device) != 0, param, master))
