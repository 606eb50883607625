"""`syncbn`: apex's synchronized-BatchNorm kernels, on torch ops.

apex's SyncBatchNorm splits batch norm into per-process pieces and exchanges the statistics between
them (all_gather of mean/var/count, all_reduce of the two gradient sums); these are the pieces, with
apex's argument orders and results:

- `welford_mean_var(input)` -> [mean, biased var] per channel;
- `welford_parallel(means, biased_vars, counts, eps)` -> [mean, unbiased var, inv_std] of the union of
  the per-process statistics (one row per process);
- `batchnorm_forward(input, mean, inv_std, weight, shift)` -> (x - mean) * inv_std * weight + shift;
- `reduce_bn(grad_output, input, mean, inv_std, weight)` -> [sum_dy, sum_dy_xmu, grad_weight, grad_bias]
  (empty gradients without a weight);
- `batchnorm_backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, counts)` -> grad_input,
  the counts being every process's element count per channel;
- the `*_c_last` variants for channels-last data (channels in the last dimension), whose forward also
  adds `z` and applies a ReLU when `fuse_relu`, and `relu_bw_c_last`, the ReLU's backward.

Statistics are fp32 for half/bfloat16 inputs (the input's dtype otherwise), computed in one pass of
torch reductions instead of apex's Welford kernels: same values up to rounding. Outputs take the
input's dtype; grad_weight/grad_bias the weight's. Unlike apex's CUDA-only kernels these run on any
device and take bfloat16 and float64 as well.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from apexlite.normalization.kernels import stats_dtype

Tensor = torch.Tensor

__all__ = [
    "welford_mean_var", "welford_parallel", "batchnorm_forward", "reduce_bn", "batchnorm_backward",
    "welford_mean_var_c_last", "batchnorm_forward_c_last", "reduce_bn_c_last", "batchnorm_backward_c_last",
    "relu_bw_c_last",
]


def _layout(input: Tensor, channel_last: bool) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(dims reduced over, shape a per-channel vector takes to broadcast against `input`)."""
    if input.dim() < 2:
        raise ValueError(f"syncbn: input must have a batch and a channel dimension; got shape {list(input.shape)}.")
    if channel_last:
        return tuple(range(input.dim() - 1)), (input.shape[-1],)
    return (0, *range(2, input.dim())), (1, input.shape[1]) + (1,) * (input.dim() - 2)


def _per_channel(vector: Optional[Tensor], shape: Tuple[int, ...], dtype: torch.dtype) -> Optional[Tensor]:
    return None if vector is None else vector.to(dtype).reshape(shape)


def _mean_var(input: Tensor, channel_last: bool) -> List[Tensor]:
    dims, _ = _layout(input, channel_last)
    with torch.no_grad():
        var, mean = torch.var_mean(input.to(stats_dtype(input.dtype)), dims, correction=0)
    return [mean, var]


def _normalized(input: Tensor, mean: Tensor, inv_std: Tensor, weight: Optional[Tensor], shift: Optional[Tensor],
                z: Optional[Tensor], channel_last: bool) -> Tensor:
    """weight * (x - mean) * inv_std + shift (+ z), in the statistics dtype."""
    _, shape = _layout(input, channel_last)
    compute = stats_dtype(input.dtype)
    out = (input.to(compute) - _per_channel(mean, shape, compute)) * _per_channel(inv_std, shape, compute)
    if weight is not None:
        out = out * _per_channel(weight, shape, compute)
    if shift is not None:
        out = out + _per_channel(shift, shape, compute)
    if z is not None:
        out = out + z.to(compute)
    return out


def _forward(input: Tensor, z: Optional[Tensor], mean: Tensor, inv_std: Tensor, weight: Optional[Tensor],
             shift: Optional[Tensor], fuse_relu: bool, channel_last: bool) -> Tensor:
    with torch.no_grad():
        out = _normalized(input, mean, inv_std, weight, shift, z, channel_last)
        if fuse_relu:
            out = out.clamp(min=0)
        return out.to(input.dtype)


def _reduce(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor, weight: Optional[Tensor],
            channel_last: bool) -> List[Tensor]:
    dims, shape = _layout(input, channel_last)
    compute = stats_dtype(input.dtype)
    with torch.no_grad():
        grad = grad_output.to(compute)
        sum_dy = grad.sum(dims)
        sum_dy_xmu = (grad * (input.to(compute) - _per_channel(mean, shape, compute))).sum(dims)
        if weight is None:
            grad_weight = grad_bias = torch.empty(0, dtype=mean.dtype, device=mean.device)
        else:
            grad_weight = (sum_dy_xmu * inv_std.to(compute)).to(weight.dtype)
            grad_bias = sum_dy.to(weight.dtype)
        return [sum_dy.to(mean.dtype), sum_dy_xmu.to(mean.dtype), grad_weight, grad_bias]


def _backward(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor, weight: Optional[Tensor],
              sum_dy: Tensor, sum_dy_xmu: Tensor, count: Tensor, channel_last: bool) -> Tensor:
    _, shape = _layout(input, channel_last)
    compute = stats_dtype(input.dtype)
    with torch.no_grad():
        total = count.to(device=input.device, dtype=torch.float64).sum().to(compute)
        inv_std_c = _per_channel(inv_std, shape, compute)
        mean_dy = _per_channel(sum_dy, shape, compute) / total
        mean_dy_xmu = _per_channel(sum_dy_xmu, shape, compute) / total
        scale = inv_std_c if weight is None else inv_std_c * _per_channel(weight, shape, compute)
        centred = input.to(compute) - _per_channel(mean, shape, compute)
        grad_input = (grad_output.to(compute) - mean_dy - centred * inv_std_c.square() * mean_dy_xmu) * scale
        return grad_input.to(input.dtype)


def welford_mean_var(input: Tensor) -> List[Tensor]:
    """[mean, biased variance] over every dimension but the channels (dim 1)."""
    return _mean_var(input, channel_last=False)


def welford_mean_var_c_last(input: Tensor) -> List[Tensor]:
    """[mean, biased variance] over every dimension but the channels (the last)."""
    return _mean_var(input, channel_last=True)


def welford_parallel(mean_feature_nodes: Tensor, var_biased: Tensor, numel: Tensor, eps: float) -> List[Tensor]:
    """[mean, unbiased variance, 1/sqrt(biased variance + eps)] of the union of per-process statistics.

    `mean_feature_nodes` and `var_biased` hold one row per process ([world_size, channels]), `numel`
    each process's element count per channel. Results take `var_biased`'s dtype.
    """
    if mean_feature_nodes.shape != var_biased.shape or mean_feature_nodes.dim() != 2:
        raise ValueError("syncbn.welford_parallel: means and variances must both be [world_size, channels]; got "
                         f"{list(mean_feature_nodes.shape)} and {list(var_biased.shape)}.")
    if numel.numel() != mean_feature_nodes.shape[0]:
        raise ValueError(f"syncbn.welford_parallel: one count per process expected ({mean_feature_nodes.shape[0]}), "
                         f"got {numel.numel()}.")
    with torch.no_grad():
        compute = torch.float64 if var_biased.dtype is torch.float64 else torch.float32
        counts = numel.reshape(-1, 1).to(device=var_biased.device, dtype=compute)
        means, variances = mean_feature_nodes.to(compute), var_biased.to(compute)
        total = counts.sum()
        mean = (means * counts).sum(0) / total
        m2 = (variances * counts + counts * (means - mean).square()).sum(0)
        results = (mean, m2 / (total - 1), torch.rsqrt(m2 / total + eps))
        return [t.to(var_biased.dtype) for t in results]


def batchnorm_forward(input: Tensor, mean: Tensor, inv_std: Tensor, weight: Optional[Tensor],
                      shift: Optional[Tensor]) -> Tensor:
    """(input - mean) * inv_std * weight + shift per channel (dim 1), in the input's dtype."""
    return _forward(input, None, mean, inv_std, weight, shift, False, channel_last=False)


def batchnorm_forward_c_last(input: Tensor, z: Optional[Tensor], mean: Tensor, inv_std: Tensor,
                             weight: Optional[Tensor], shift: Optional[Tensor], fuse_relu: bool) -> Tensor:
    """batchnorm_forward for channels-last data, plus `z` (a residual), then a ReLU when `fuse_relu`."""
    return _forward(input, z, mean, inv_std, weight, shift, bool(fuse_relu), channel_last=True)


def reduce_bn(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor,
              weight: Optional[Tensor]) -> List[Tensor]:
    """[sum_dy, sum_dy_xmu, grad_weight, grad_bias]: sum(dy) and sum(dy * (x - mean)) per channel (mean's
    dtype), grad_weight = sum_dy_xmu * inv_std and grad_bias = sum_dy (weight's dtype; empty without one)."""
    return _reduce(grad_output, input, mean, inv_std, weight, channel_last=False)


def reduce_bn_c_last(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor,
                     weight: Optional[Tensor]) -> List[Tensor]:
    """reduce_bn for channels-last data."""
    return _reduce(grad_output, input, mean, inv_std, weight, channel_last=True)


def batchnorm_backward(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor, weight: Optional[Tensor],
                       sum_dy: Tensor, sum_dy_xmu: Tensor, count: Tensor) -> Tensor:
    """grad_input from the (all-reduced) sums; `count` holds every process's element count per channel."""
    return _backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, channel_last=False)


def batchnorm_backward_c_last(grad_output: Tensor, input: Tensor, mean: Tensor, inv_std: Tensor,
                              weight: Optional[Tensor], sum_dy: Tensor, sum_dy_xmu: Tensor, count: Tensor) -> Tensor:
    """batchnorm_backward for channels-last data."""
    return _backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, channel_last=True)


def relu_bw_c_last(grad_output: Tensor, input: Tensor, z: Optional[Tensor], mean: Tensor, inv_std: Tensor,
                   weight: Optional[Tensor], shift: Optional[Tensor]) -> Tensor:
    """The fused ReLU's backward: grad_output where batchnorm_forward_c_last's pre-ReLU value is > 0, else 0."""
    with torch.no_grad():
        active = _normalized(input, mean, inv_std, weight, shift, z, channel_last=True) > 0
        return torch.where(active, grad_output, torch.zeros_like(grad_output)).to(input.dtype)
