"""`apex.parallel.LARC`: layer-wise adaptive rate clipping/scaling around any optimizer."""
from __future__ import annotations

from typing import Any, Dict, List

import torch


class LARC:
    """Wraps `optimizer`; each step rescales every gradient by a per-parameter trust ratio.

    ratio = trust_coefficient * ||p|| / (||g|| + wd*||p|| + eps) (only when both norms are non-zero);
    with `clip` the ratio becomes min(ratio / lr, 1) so the effective lr never exceeds the group's.
    The group's weight decay is folded into the gradient first (g += wd*p) and set to 0 for the inner
    step, then restored.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.02, clip: bool = True,
                 eps: float = 1e-8) -> None:
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    def __getstate__(self) -> Any:
        return self.optim.__getstate__()

    def __setstate__(self, state: Any) -> None:
        self.optim.__setstate__(state)

    def __repr__(self) -> str:
        return f"LARC({self.optim!r})"

    @property
    def state(self) -> Any:
        return self.optim.state

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value: List[Dict[str, Any]]) -> None:
        self.optim.param_groups = value

    def state_dict(self) -> Dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        self.optim.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def step(self) -> Any:
        saved_decay = []
        with torch.no_grad():
            for group in self.optim.param_groups:
                weight_decay = group.get("weight_decay", 0)
                saved_decay.append(weight_decay)
                group["weight_decay"] = 0
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    param_norm, grad_norm = param.norm(), param.grad.norm()
                    if param_norm == 0 or grad_norm == 0:
                        continue
                    ratio = self.trust_coefficient * param_norm / (grad_norm + param_norm * weight_decay + self.eps)
                    if self.clip:
                        ratio = torch.clamp(ratio / group["lr"], max=1.0)
                    param.grad.add_(param, alpha=weight_decay).mul_(ratio)
        try:
            return self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, saved_decay):
                group["weight_decay"] = weight_decay
