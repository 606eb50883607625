"""`apex.contrib.optimizers.fp16_optimizer`: the 2019 FP16_Optimizer (also `apex.optimizers.FP16_Optimizer`
in 2019 scripts), a cut-down apex.fp16_utils.FP16_Optimizer for fp16 models.

Every param of the wrapped optimizer is replaced by an fp32 master copy; `backward(loss)` scales the
loss; `step()` checks the fp16 gradients for inf/NaN (one host read), skips and lowers the scale on
overflow, and otherwise steps. apex's 2019 optimizers (apex.contrib.optimizers.FusedAdam/FusedSGD)
take the fp16 grads, the fp16 params to write and the scale in their `step()`, as apex did. apexlite
also wraps any other torch optimizer (apex's failed): the masters then get the unscaled fp32 grads,
the optimizer steps them, and the fp16 params receive the new values.

Scale rules (apex's, for this class): dynamic scaling starts at 2**16, divides by 2 on an overflow (not
below 1) and doubles after every 1000 iterations since the last overflow; a static scale never moves.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional

import torch

from apexlite._logging import get_logger
from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401  (apex's module name)
from apexlite.optimizers.multi_tensor.norms import multi_tensor_l2norm

log = get_logger("contrib.optimizers")


def takes_fp16_grads(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` takes apex's 2019 ``grads=`` and ``output_params=`` keywords."""
    try:
        parameters = inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False
    return "grads" in parameters and "output_params" in parameters


class FP16_Optimizer:
    """apex's 2019 FP16_Optimizer (see the module docstring)."""

    def __init__(self, init_optimizer: torch.optim.Optimizer, static_loss_scale: float = 1.0,
                 dynamic_loss_scale: bool = False, dynamic_loss_args: Optional[Dict[str, Any]] = None,
                 verbose: bool = True) -> None:
        log.info("apex.contrib.optimizers.FP16_Optimizer: fp32 master weights for an fp16 model; amp.initialize "
                 "(opt_level='O2') is the maintained way to do this.")
        self.optimizer = init_optimizer
        self.fp16_groups: List[List[torch.Tensor]] = []
        self.fp32_groups: List[List[torch.Tensor]] = []
        for group in self.optimizer.param_groups:
            self.fp16_groups.append(list(group["params"]))
            self.fp32_groups.append([p.clone().float().detach() for p in group["params"]])
            group["params"] = self.fp32_groups[-1]
        self._legacy_step = takes_fp16_grads(init_optimizer)
        device = self.fp16_groups[0][0].device if self.fp16_groups and self.fp16_groups[0] else torch.device("cpu")
        self.overflow_buf = torch.tensor([0], dtype=torch.int, device=device)
        self.multi_tensor_l2norm = multi_tensor_l2norm
        self.cur_iter = 0
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        if self.dynamic_loss_scale:
            if dynamic_loss_args is not None:
                raise SystemError("apex.contrib.optimizers.FP16_Optimizer takes no dynamic_loss_args (its dynamic "
                                  "scale starts at 2**16 and doubles every 1000 clean iterations); use "
                                  "apex.fp16_utils.FP16_Optimizer for a configurable dynamic scale.")
            self.cur_scale = 2.0 ** 16
            self.last_overflow_iter = -1
            self.scale_factor = 2
            self.scale_window = 1000
        else:
            self.cur_scale = static_loss_scale
        self.verbose = verbose

    def zero_grad(self, set_grads_to_None: bool = True) -> None:
        """Clear the fp16 model grads (to None by default: fp32 grads never exist outside a step)."""
        for group in self.fp16_groups:
            for param in group:
                if set_grads_to_None:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_()
                    param.grad.zero_()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss.float() * loss_scale``: the fp16 grads carry the scale."""
        (loss.float() * self.cur_scale).backward()

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        """Step unless the fp16 grads overflowed; update the loss scale either way (no closure support)."""
        if closure is not None:
            raise RuntimeError("apex.contrib.optimizers.FP16_Optimizer.step does not take a closure (as in apex).")
        fp16_grads = [[p.grad for p in group] for group in self.fp16_groups]
        self.overflow_buf.zero_()
        norm_groups = []
        for grads in fp16_grads:
            present = [g for g in grads if g is not None]
            norm = (self.multi_tensor_l2norm(0, self.overflow_buf, [present], True)[0] if present
                    else torch.zeros(1, device=self.overflow_buf.device))
            norm_groups.append(norm)
        if bool(self.overflow_buf.item()):
            self._update_scale(True)
            return
        if self._legacy_step:
            self.optimizer.step(grads=fp16_grads, output_params=self.fp16_groups, scale=self.cur_scale,
                                grad_norms=norm_groups)
        else:
            self._step_any_optimizer(fp16_grads)
        self._update_scale(False)

    def _step_any_optimizer(self, fp16_grads: List[List[Optional[torch.Tensor]]]) -> None:
        """Unscaled fp32 grads on the masters, the optimizer's own step, then masters to the model."""
        for masters, grads in zip(self.fp32_groups, fp16_grads):
            for master, grad in zip(masters, grads):
                master.grad = None if grad is None else grad.detach().float().div_(self.cur_scale)
        self.optimizer.step()
        with torch.no_grad():
            for masters, params in zip(self.fp32_groups, self.fp16_groups):
                for master, param in zip(masters, params):
                    if master is not param:
                        param.copy_(master)
                    master.grad = None

    def _update_scale(self, skip: bool) -> None:
        if self.dynamic_loss_scale:
            if skip:
                log.warning("Grad overflow on iteration %d; skipping the step. Dynamic loss scale was %s.",
                            self.cur_iter, self.cur_scale)
                self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
                self.last_overflow_iter = self.cur_iter
            elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.cur_scale *= self.scale_factor
        elif skip:
            log.warning("Grad overflow on iteration %d; skipping the step. Static loss scale %s.",
                        self.cur_iter, self.cur_scale)
        self.cur_iter += 1

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: List[Dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    def state_dict(self) -> Dict[str, Any]:
        """apex's layout: the scale state, the wrapped optimizer's state dict and the fp32 masters."""
        state = {"dynamic_loss_scale": self.dynamic_loss_scale, "cur_scale": self.cur_scale,
                 "cur_iter": self.cur_iter}
        if self.dynamic_loss_scale:
            state.update(last_overflow_iter=self.last_overflow_iter, scale_factor=self.scale_factor,
                         scale_window=self.scale_window)
        state["optimizer_state_dict"] = self.optimizer.state_dict()
        state["fp32_groups"] = self.fp32_groups
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a state dict of this class (apex's or apexlite's); the masters take the saved values."""
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.cur_scale = state_dict["cur_scale"]
        self.cur_iter = state_dict["cur_iter"]
        if self.dynamic_loss_scale:
            self.last_overflow_iter = state_dict["last_overflow_iter"]
            self.scale_factor = state_dict["scale_factor"]
            self.scale_window = state_dict["scale_window"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for current, saved in zip(self.fp32_groups, state_dict["fp32_groups"]):
                for master, value in zip(current, saved):
                    master.copy_(value)
