"""SyncBatchNorm for apexlite: torch's `nn.SyncBatchNorm`, under the legacy names.

Batch statistics are all-reduced by torch's implementation (GPU/XPU backends only: torch refuses a
CPU input in training mode with world size > 1). Under O2, `keep_batchnorm_fp32` keeps these layers
fp32 like any batchnorm, since SyncBatchNorm is a torch `_BatchNorm`.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

_CHANNEL_LAST_ERROR = (
    "channel_last=True (an input laid out as (N, ..., C)) is not supported: torch's SyncBatchNorm "
    "takes (N, C, ...) inputs in either memory format; pass x.permute(...) or a channels_last tensor."
)


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm with the legacy constructor (the `channel_last` argument)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Optional[Any] = None,
                 channel_last: bool = False) -> None:
        if channel_last:
            raise ValueError(_CHANNEL_LAST_ERROR)
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, process_group=process_group)


def convert_syncbn_model(module: torch.nn.Module, process_group: Optional[Any] = None,
                         channel_last: bool = False) -> torch.nn.Module:
    """Replace every batchnorm in `module` by torch's SyncBatchNorm (stats and affine params kept).

    Call it before `amp.initialize`, so O2 sees (and keeps fp32) the new layers.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert_syncbn_model takes the model (a torch.nn.Module); got {type(module).__name__}.")
    if channel_last:
        raise ValueError(_CHANNEL_LAST_ERROR)
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)


def create_syncbn_process_group(group_size: int) -> Optional[Any]:
    """Split the world into groups of `group_size` consecutive ranks; return this rank's group.

    0 means the whole world (returns None). Every rank must call this (it creates every group).
    """
    if group_size == 0:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    if group_size < 0 or world % group_size:
        raise ValueError(f"group_size must divide the world size {world}; got {group_size}.")
    groups: List[Any] = [dist.new_group(list(range(start, start + group_size)))
                         for start in range(0, world, group_size)]
    return groups[rank // group_size]
