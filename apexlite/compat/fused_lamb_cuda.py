"""`fused_lamb_cuda`: the LAMB kernel of apex's 2019 FusedLAMB (built by apex's `--deprecated_fused_lamb`).

`lamb(chunk_size, noop_flag, [grads, params, exp_avgs, exp_avg_sqs], lr, beta1, beta2, epsilon, step,
bias_correction, weight_decay, grad_averaging, mode, global_grad_norm, max_grad_norm)` is amp_C's
`multi_tensor_lamb` with the global gradient norm as a number and without `use_nvlamb` (the trust
ratio applies to tensors with weight decay only): it runs apexlite's LAMB rule, leaves each tensor's
update direction in its gradient and raises `noop_flag` on an inf/NaN norm, as apex's kernel did.
"""
from __future__ import annotations

from typing import Sequence

import torch

from apexlite.optimizers.multi_tensor import multi_tensor_lamb

__all__ = ["lamb"]


def lamb(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Sequence[torch.Tensor]], lr: float,
         beta1: float, beta2: float, epsilon: float, step: int, bias_correction: int, weight_decay: float,
         grad_averaging: int, mode: int, global_grad_norm: float, max_grad_norm: float) -> None:
    """One LAMB step over [grads, params, exp_avgs, exp_avg_sqs] in place (see the module docstring)."""
    multi_tensor_lamb(chunk_size, noop_flag, [list(tensors) for tensors in tensor_lists], lr, beta1, beta2, epsilon,
                      step, bias_correction, weight_decay, grad_averaging, mode, float(global_grad_norm),
                      max_grad_norm, use_nvlamb=False)
