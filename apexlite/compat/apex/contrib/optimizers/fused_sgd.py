"""`apex.contrib.optimizers.fused_sgd`: the 2019 FusedSGD, which takes its gradients and fp16 output
params from `apex.contrib.optimizers.FP16_Optimizer` (``step(grads=, output_params=, scale=)``).

The update is apexlite's SGD rule (:mod:`apexlite.optimizers._sgd_rule`, apex's multi_tensor_sgd):
the optimizer's params are the fp32 masters, the gradients are divided by ``scale``, and fp16 model
params receive the new weights. For an optimizer that takes its gradients from ``p.grad``, use
``apex.optimizers.FusedSGD``.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from torch.optim.optimizer import Optimizer, required  # noqa: F401  (apex's module names)

from apexlite.compat.apex.contrib.optimizers.fused_adam import per_group
from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401  (apex's module name)
from apexlite.optimizers import multi_tensor
from apexlite.optimizers._sgd_rule import sgd_update

_WRAP = ("apex.contrib.optimizers.FusedSGD must be wrapped with apex.contrib.optimizers.FP16_Optimizer, which "
         "provides {}; for a plain SGD step use apex.optimizers.FusedSGD.")


class FusedSGD(Optimizer):
    """apex's 2019 FusedSGD (momentum, dampening, Nesterov, decay before or after momentum)."""

    def __init__(self, params: Iterable[Any], lr: float = required, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov)
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        device = self.param_groups[0]["params"][0].device
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)
        self.multi_tensor_sgd = multi_tensor.multi_tensor_sgd

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def get_momentums(self, params: List[torch.Tensor]) -> Tuple[List[torch.Tensor], bool]:
        """Each param's momentum buffer (created zeroed when missing) and whether the last one was new."""
        momentums, first_run = [], True
        for param in params:
            state = self.state[param]
            first_run = "momentum_buffer" not in state
            if first_run:
                state["momentum_buffer"] = torch.zeros_like(param)
            momentums.append(state["momentum_buffer"])
        return momentums, first_run

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, grads: Any = None, output_params: Any = None,
             scale: float = 1.0, grad_norms: Any = None) -> Any:
        """One step with the gradients and output params handed over by FP16_Optimizer (``grad_norms``
        is accepted and unused, as in apex)."""
        if hasattr(self, "_amp_stash"):
            raise RuntimeError("apex.contrib.optimizers.FusedSGD should not be used with AMP; "
                               "use apex.optimizers.FusedSGD with amp.")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grads is None:
            raise RuntimeError(_WRAP.format("grads"))
        if output_params is None:
            raise RuntimeError(_WRAP.format("output_params"))
        groups = len(self.param_groups)
        for group, group_grads, group_outputs in zip(self.param_groups, per_group(grads, groups),
                                                     per_group(output_params, groups)):
            if group_grads is None or group_outputs is None or any(g is None for g in group_grads):
                raise RuntimeError("apex.contrib.optimizers.FusedSGD only works when all parameters require grad "
                                   "and receive a gradient.")
            self._step_group(group, group_grads, group_outputs, scale)
        return loss

    def _step_group(self, group: dict, grads: List[torch.Tensor], outputs: List[torch.Tensor], scale: float) -> None:
        hyper = dict(weight_decay=group["weight_decay"], momentum=group["momentum"], dampening=group["dampening"],
                     lr=group["lr"], nesterov=group["nesterov"], wd_after_momentum=self.wd_after_momentum,
                     scale=1.0 / scale)
        for master, grad, output in zip(group["params"], grads, outputs):
            momenta, first_run = self.get_momentums([master])
            # an fp32 model param gets its master's value too (apex left it behind its master)
            copies = [output] if output is not master else None
            sgd_update([grad], [master], momenta, copies, first_run=first_run, **hyper)
