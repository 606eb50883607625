"""GradScaler's contract for optimizers that unscale inside ``step()`` (``_step_supports_amp_scaling``).

``torch.amp.GradScaler.step`` hands such an optimizer ``grad_scale`` and ``found_inf`` instead of
unscaling the gradients itself, so after a clean step the optimizer must leave each unscaled gradient
in the tensor that ``.grad`` *is*, in place, whatever its strides. A fused kernel that needs the
param's layout works on a laid-out copy of the grad and must store the copy's unscaled values back.
A gradient whose elements share memory (e.g. made by ``expand``) cannot hold them: it is refused
before anything is updated, as torch's own unscale refuses it.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

_OVERLAP_YES = 1  # torch's MemOverlap::Yes (0: no overlap, 2: too hard to tell, which torch lets through)


def has_internal_overlap(tensor: torch.Tensor) -> bool:
    """Whether two elements of ``tensor`` are one memory location (what torch's in-place ops refuse)."""
    return torch._debug_has_internal_overlap(tensor) == _OVERLAP_YES


def check_grads_writable(params_and_grads: Iterable[Tuple[torch.Tensor, Optional[torch.Tensor]]], owner: str) -> None:
    """Raises before any update when a gradient that must receive its unscaled values cannot hold them.

    Only a gradient laid out unlike its param is inspected (a param with shared elements cannot be
    updated in place either), which keeps the check off the common path.
    """
    for param, grad in params_and_grads:
        if grad is not None and grad.stride() != param.stride() and has_internal_overlap(grad):
            raise RuntimeError(
                f"{owner}: the gradient of a param of shape {tuple(param.shape)} has strides {grad.stride()}, "
                "so several of its elements share one memory location (an expanded or broadcast tensor). "
                "Under a GradScaler the step stores the unscaled gradient into .grad in place, which such a "
                "tensor cannot hold; assign a materialised gradient instead (param.grad = grad.clone())."
            )
