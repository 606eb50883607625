"""`apex.parallel.SyncBatchNorm` and `convert_syncbn_model`, on torch.nn.SyncBatchNorm.

On GPU torch's SyncBatchNorm does the work. torch's version refuses CPU tensors once a process group
is up, so for CPU (gloo) training the batch statistics are synchronised here with a differentiable
allreduce of per-channel sums: every process normalises with the statistics of the global batch and
gets the gradients it would get from one big batch.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from apexlite.compat import generic

_CHANNEL_LAST_ADVICE = ("channel_last=True is not supported by apexlite's SyncBatchNorm; keep the default "
                        "and use tensors in torch.channels_last memory format instead (same NCHW shape).")


class _AllReduceSum(torch.autograd.Function):
    """Sum over processes whose backward also sums: every rank's output depends on every rank's input."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        reduced = tensor.clone()
        dist.all_reduce(reduced, group=group)
        return reduced

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = grad.clone()
        dist.all_reduce(reduced, group=ctx.group)
        return reduced, None


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """apex's constructor (plus fuse_relu and the residual input `z` of apex's CUDA version)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, channel_last: bool = False,
                 fuse_relu: bool = False) -> None:
        if channel_last:
            raise AttributeError(_CHANNEL_LAST_ADVICE)
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group)
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def _needs_cpu_sync(self, input: torch.Tensor) -> bool:
        return (self.training and input.device.type == "cpu" and dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def forward(self, input: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self._needs_cpu_sync(input):
            out = self._cpu_sync_forward(input)
        elif input.device.type == "cpu":  # nothing to sync (one rank, eval): local batch norm, which torch's
            out = _BatchNorm.forward(self, input)  # SyncBatchNorm refuses on CPU once dist is initialised
        else:
            out = super().forward(input)
        if z is not None:
            out = out + z
        return torch.relu(out) if self.fuse_relu else out

    def _cpu_sync_forward(self, input: torch.Tensor) -> torch.Tensor:
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        group = self.process_group or dist.group.WORLD
        x = input.float()
        count = torch.tensor([input.numel() / channels], dtype=torch.float32)
        totals = _AllReduceSum.apply(torch.cat([x.sum(dims), count]), group)
        n = totals[-1]
        mean = totals[:channels] / n
        centered = x - mean.view(shape)  # two passes: E[x^2] - mean^2 loses the variance when the mean is large
        var = _AllReduceSum.apply((centered * centered).sum(dims), group) / n
        y = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.float().view(shape) + self.bias.float().view(shape)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach() * n / (n - 1))
        return y.to(input.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased_var.to(self.running_var.dtype), alpha=factor)


def convert_syncbn_model(module: torch.nn.Module, process_group: Any = None,
                         channel_last: bool = False) -> torch.nn.Module:
    """Replace every batchnorm layer (not instance norm) with SyncBatchNorm, keeping weights and stats."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert_syncbn_model takes the model (a torch.nn.Module); got {type(module).__name__}.")
    if isinstance(module, _BatchNorm) and not isinstance(module, torch.nn.modules.instancenorm._InstanceNorm):
        converted = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats, process_group, channel_last=channel_last)
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        if module.affine:
            with torch.no_grad():
                converted.weight.copy_(module.weight)
                converted.bias.copy_(module.bias)
        reference = next(iter(list(module.parameters()) + list(module.buffers())), None)
        return converted if reference is None else converted.to(reference.device)
    for name, child in module.named_children():
        module.add_module(name, convert_syncbn_model(child, process_group, channel_last))
    return module


def create_syncbn_process_group(group_size: int) -> Any:
    """None (the whole world) for 0; otherwise groups of `group_size` consecutive ranks, returning ours."""
    if group_size == 0:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide the world size {world}.")
    mine = None
    for start in range(0, world, group_size):
        group = dist.new_group(list(range(start, start + group_size)))  # every rank must create every group
        if start <= rank < start + group_size:
            mine = group
    return mine


__getattr__ = generic.fallback_getattr(__name__)
