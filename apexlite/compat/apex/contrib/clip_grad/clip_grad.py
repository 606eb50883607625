"""`apex.contrib.clip_grad.clip_grad`: clip_grad_norm_, as apex ran it without its amp_C kernel (on torch's)."""
from __future__ import annotations

from typing import Iterable, Union

import torch

from apexlite.compat import generic


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> torch.Tensor:
    """Scale the gradients so that their total `norm_type` norm is at most `max_norm`; returns that norm.

    torch.nn.utils.clip_grad_norm_ over the parameters that have a gradient; with none it returns
    `torch.tensor(0.)`, as apex's did.
    """
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    return torch.nn.utils.clip_grad_norm_(params, float(max_norm), norm_type=float(norm_type),
                                          error_if_nonfinite=error_if_nonfinite)


__getattr__ = generic.fallback_getattr(__name__)
