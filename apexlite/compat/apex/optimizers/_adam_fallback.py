"""FusedAdam for the compat layer: apexlite's fused FusedAdam when importable, else a torch one.

The fallback keeps apex's constructor and update (Adam with L2 decay, or AdamW) on torch.optim,
and says once in the log that the fused kernel is not in use.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import torch

from apexlite._logging import get_logger

log = get_logger("compat.optimizers")


class TorchFusedAdam(torch.optim.Adam):
    """apex's FusedAdam signature on torch.optim.Adam (adam_w_mode=True means decoupled decay)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True) -> None:
        if not bias_correction:
            raise ValueError("bias_correction=False needs apexlite's FusedAdam (apexlite.optimizers), "
                             "which is not importable here; run `python -m apexlite doctor`.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         decoupled_weight_decay=adam_w_mode)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)


def resolve_fused_adam() -> type:
    """apexlite.optimizers.FusedAdam, or TorchFusedAdam (logged) when that cannot be imported."""
    try:
        from apexlite.optimizers import FusedAdam
    except ImportError as error:
        log.warning("apexlite.optimizers.FusedAdam is unavailable (%s); apex.optimizers.FusedAdam "
                    "uses torch.optim.Adam with apex's arguments instead.", error)
        return TorchFusedAdam
    return FusedAdam
