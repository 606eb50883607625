"""What apexlite's optimizers share with apex's: `set_grad_none` as zero_grad's default, closures, and
the attributes apex's optimizers created for their kernels (subclasses written against apex read them)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch


def clear_grads(params: Iterable[torch.Tensor], set_to_none: bool, foreach: bool) -> None:
    """torch.optim.Optimizer.zero_grad's rule for ``params``: drop each grad, or detach it and zero it in place
    (one foreach call per device and dtype when ``foreach``)."""
    batches: dict = {}
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if set_to_none:
            param.grad = None
            continue
        if grad.grad_fn is not None:
            grad.detach_()
        else:
            grad.requires_grad_(False)
        if foreach and not grad.is_sparse:
            batches.setdefault((grad.device, grad.dtype), []).append(grad)
        else:
            grad.zero_()
    for grads in batches.values():
        torch._foreach_zero_(grads)


class ApexStyleOptimizer(torch.optim.Optimizer):
    """A torch Optimizer whose `zero_grad()` defaults to the constructor's `set_grad_none`."""

    set_grad_none: bool = True

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Clears gradients; ``set_to_none`` defaults to the constructor's ``set_grad_none``."""
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def _make_overflow_buf(self) -> None:
        """apex's ``_dummy_overflow_buf``: the int32 no-op flag its kernels take, on the first param's device."""
        params = [p for group in self.param_groups for p in group["params"]]
        device = params[0].device if params else torch.device("cpu")
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    @staticmethod
    def _closure_loss(closure: Optional[Callable[[], Any]]) -> Any:
        """Re-evaluate the model with grad enabled when a closure is given (torch's step contract)."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
