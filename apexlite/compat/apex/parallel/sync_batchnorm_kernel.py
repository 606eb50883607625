"""`apex.parallel.sync_batchnorm_kernel`: SyncBatchnormFunction, the autograd function of apex's
python SyncBatchNorm.

`SyncBatchnormFunction.apply(input, weight, bias, mean, var, eps, process_group, world_size)` normalizes
`input` (N, C, ...) with the given per-channel batch statistics (the caller computes them over every
process's batch) and affine `weight`/`bias` (either may be None). Its backward treats the statistics as
those of the global batch: the per-channel means of the output gradient and of its product with the
normalized input are averaged over the `world_size` processes of `process_group` when torch.distributed
is initialized, so each process gets the input gradient one big batch would give.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
from torch.autograd.function import Function

from apexlite.compat import generic


def _per_channel(tensor: torch.Tensor, ndim: int) -> torch.Tensor:
    return tensor.view([1, -1] + [1] * (ndim - 2))


def _channel_mean(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.transpose(0, 1).reshape(tensor.shape[1], -1).mean(1)


class SyncBatchnormFunction(Function):
    """Batch norm with given (global) statistics whose backward averages its reductions over processes."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                mean: torch.Tensor, var: torch.Tensor, eps: float, process_group: Any = None,
                world_size: int = 1) -> torch.Tensor:
        inv_std = torch.rsqrt(var + eps)
        normalized = (input - _per_channel(mean, input.dim())) * _per_channel(inv_std, input.dim())
        ctx.save_for_backward(normalized, weight, inv_std)
        ctx.process_group, ctx.world_size, ctx.has_bias = process_group, world_size, bias is not None
        out = normalized
        if weight is not None:
            out = out * _per_channel(weight, input.dim())
        if bias is not None:
            out = out + _per_channel(bias, input.dim())
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        normalized, weight, inv_std = ctx.saved_tensors
        ndim = grad_output.dim()
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            mean_dy = _channel_mean(grad_output)
            mean_dy_xhat = _channel_mean(grad_output * normalized)
            if dist.is_available() and dist.is_initialized():
                for reduced in (mean_dy, mean_dy_xhat):
                    dist.all_reduce(reduced, dist.ReduceOp.SUM, ctx.process_group)
                    reduced /= ctx.world_size
            scale = inv_std if weight is None else inv_std * weight
            grad_input = (grad_output - _per_channel(mean_dy, ndim) - normalized * _per_channel(mean_dy_xhat, ndim)
                          ) * _per_channel(scale, ndim)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (grad_output * normalized).transpose(0, 1).reshape(normalized.shape[1], -1).sum(1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.transpose(0, 1).reshape(grad_output.shape[1], -1).sum(1)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


__getattr__ = generic.fallback_getattr(__name__)
