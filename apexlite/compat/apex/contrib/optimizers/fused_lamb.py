"""`apex.contrib.optimizers.fused_lamb`: the 2019 FusedLAMB (apex.optimizers.FusedLAMB without NVLAMB).

The update is apexlite's LAMB rule (:mod:`apexlite.optimizers._lamb_rule`), as for
``apex.optimizers.FusedLAMB``: the trust ratio applies to params with weight decay only.
"""
from __future__ import annotations

from typing import Any, Iterable, Tuple

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401  (apex's module name)
from apexlite.optimizers.fused_lamb import FusedLAMB as _FusedLAMB


class FusedLAMB(_FusedLAMB):
    """apex's 2019 FusedLAMB: the constructor of apex.contrib.optimizers.FusedLAMB (no ``use_nvlamb``)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float = 1.0) -> None:
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                         grad_averaging=grad_averaging, set_grad_none=set_grad_none, max_grad_norm=max_grad_norm,
                         use_nvlamb=False)
