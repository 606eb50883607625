"""`apex._autocast_utils`: `_cast_if_autocast_enabled`, which apex's fused modules call on their inputs."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from apexlite.amp.o1.policies import map_tensors

__all__ = ["_cast_if_autocast_enabled"]


def _enabled_autocast() -> Optional[Tuple[str, torch.dtype]]:
    """(device type, dtype) of the autocast region the caller is in (CUDA first, then CPU), or None."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4: one API for every device
        for device_type in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device_type):
                return device_type, torch.get_autocast_dtype(device_type)
        return None
    if torch.is_autocast_enabled():
        return "cuda", torch.get_autocast_gpu_dtype()
    if torch.is_autocast_cpu_enabled():
        return "cpu", torch.get_autocast_cpu_dtype()
    return None


def _cast_if_autocast_enabled(*args: Any) -> Tuple[Any, ...]:
    """`args` unchanged outside autocast; inside, their floating tensors on the autocast device (float64
    excepted) cast to the autocast dtype, containers rebuilt, as torch's autocast casts op inputs.

    apex looked only at CUDA autocast; this also casts under CPU autocast.
    """
    region = _enabled_autocast()
    if region is None:
        return args
    device_type, dtype = region

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_floating_point() and tensor.dtype is not torch.float64 and tensor.device.type == device_type:
            return tensor.to(dtype)
        return tensor

    return map_tensors(args, cast)
