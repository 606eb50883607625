"""`apex.fp16_utils.FP16_Optimizer`: manual fp16 training with fp32 master weights and loss scaling.

The wrapped optimizer's fp16/bf16 params are replaced, in its param groups, by fp32 master copies;
`backward` scales the loss, `update_master_grads` copies the grads into the masters, unscales them and
checks for overflow with amp's LossScaler, and `step` skips on overflow and otherwise steps the masters
and copies them back into the model. Attribute names follow apex (fp16_groups, fp32_from_fp16_groups,
fp32_from_fp32_groups, loss_scaler, overflow, ...), as does the state dict.

Scaling follows apex's rules for this class (apex.amp.scaler.LossScaler): static `static_loss_scale`,
or dynamic from 2**16 (halved on overflow, doubled after 2000 clean steps, at most 2**24); every key
of `dynamic_loss_args` (init_scale, scale_factor, scale_window, min_loss_scale, max_loss_scale) is
passed to the scaler. apex silently capped an init_scale above max_loss_scale; apexlite says so.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn  # noqa: F401  (this and the other unused names: what apex's module defines)
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors  # noqa: F401
from torch.autograd import Variable  # noqa: F401
from torch.nn.parameter import Parameter  # noqa: F401

from apexlite._logging import get_logger
from apexlite.compat import generic
from apexlite.compat.apex.amp._amp_state import _amp_state, maybe_print  # noqa: F401
from apexlite.compat.apex.amp.scaler import LossScaler
from apexlite.compat.apex.fp16_utils._scaler_state import restore_loss_scaler
from apexlite.compat.apex.fp16_utils.fp16util import (  # noqa: F401
    clip_grad_norm, master_params_to_model_params, model_grads_to_master_grads,
)
from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401
from apexlite.optimizers.multi_tensor.norms import multi_tensor_scale

log = get_logger("fp16_utils")
_LOW = (torch.float16, torch.bfloat16)
DYNAMIC_LOSS_ARGS = ("init_scale", "scale_factor", "scale_window", "min_loss_scale", "max_loss_scale")


def dynamic_scaler(dynamic_loss_args: Optional[Dict[str, Any]]) -> LossScaler:
    """LossScaler("dynamic", **dynamic_loss_args), with unknown keys and a capped init_scale reported."""
    args = dict(dynamic_loss_args or {})
    unknown = sorted(set(args) - set(DYNAMIC_LOSS_ARGS))
    if unknown:
        raise TypeError(f"FP16_Optimizer: dynamic_loss_args has unknown keys {unknown}; the dynamic loss scaler "
                        f"takes {', '.join(DYNAMIC_LOSS_ARGS)}.")
    init_scale, max_scale = args.get("init_scale", 2.0 ** 16), args.get("max_loss_scale", 2.0 ** 24)
    if init_scale > max_scale:
        log.warning("FP16_Optimizer: dynamic_loss_args init_scale=%g is above max_loss_scale=%g, so the scale starts "
                    "at %g (as in apex); pass a larger max_loss_scale to start higher.",
                    init_scale, max_scale, max_scale)
    return LossScaler("dynamic", **args)


class FP16_Optimizer:
    """Wraps `init_optimizer`: static scale `static_loss_scale`, or dynamic (see the module docstring)."""

    def __init__(self, init_optimizer: torch.optim.Optimizer, static_loss_scale: float = 1.0,
                 dynamic_loss_scale: bool = False, dynamic_loss_args: Optional[Dict[str, Any]] = None,
                 verbose: bool = True) -> None:
        self.verbose = verbose
        if not hasattr(init_optimizer, "param_groups"):
            raise TypeError(f"FP16_Optimizer wraps a torch.optim optimizer, got {type(init_optimizer).__name__}: "
                            "build one over the fp16 model's params first, e.g. "
                            "FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)")
        self.optimizer = init_optimizer
        self.fp16_groups: List[List[torch.Tensor]] = []
        self.fp32_from_fp16_groups: List[List[torch.Tensor]] = []
        self.fp32_from_fp32_groups: List[List[torch.Tensor]] = []
        for index, group in enumerate(init_optimizer.param_groups):
            self.maybe_print(f"FP16_Optimizer processing param group {index}:")
            fp16, masters, fp32 = [], [], []
            for i, param in enumerate(group["params"]):
                if not param.requires_grad:
                    continue
                if param.dtype in _LOW:
                    self.maybe_print(f"FP16_Optimizer received {param.dtype} with {tuple(param.shape)}")
                    master = param.detach().clone().float().requires_grad_(True)
                    group["params"][i] = master
                    if param in init_optimizer.state:
                        init_optimizer.state[master] = init_optimizer.state.pop(param)
                    fp16.append(param)
                    masters.append(master)
                elif param.dtype == torch.float32:
                    self.maybe_print(f"FP16_Optimizer received torch.float32 with {tuple(param.shape)}")
                    fp32.append(param)
                else:
                    raise TypeError("Wrapped parameters must be float32, float16 or bfloat16 tensors. "
                                    f"Received {param.dtype}")
            self.fp16_groups.append(fp16)
            self.fp32_from_fp16_groups.append(masters)
            self.fp32_from_fp32_groups.append(fp32)
        self.all_fp16_params = [p for group in self.fp16_groups for p in group]
        self.all_fp32_from_fp16_params = [p for group in self.fp32_from_fp16_groups for p in group]
        self.all_fp32_from_fp32_params = [p for group in self.fp32_from_fp32_groups for p in group]
        init_optimizer.load_state_dict(init_optimizer.state_dict())  # recast existing state to the masters
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        self.loss_scaler = dynamic_scaler(dynamic_loss_args) if dynamic_loss_scale else LossScaler(static_loss_scale)
        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm
        self.multi_tensor_scale = multi_tensor_scale
        device = self.all_fp16_params[0].device if self.all_fp16_params else torch.device("cpu")
        self._dummy_overflow_buf = torch.tensor([0], dtype=torch.int, device=device)

    def maybe_print(self, msg: str) -> None:
        if self.verbose:
            log.info("%s", msg)

    def __getstate__(self) -> None:
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    # --- training loop -------------------------------------------------------------------------
    def zero_grad(self, set_grads_to_None: bool = False) -> None:
        """Clear the master, fp32 and model grads (to None when `set_grads_to_None`)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]] + self.all_fp16_params
        for param in params:
            if param.grad is None:
                continue
            if set_grads_to_None:
                param.grad = None
            else:
                param.grad.detach_().zero_()

    def backward(self, loss: torch.Tensor, update_master_grads: bool = True, retain_graph: bool = False) -> None:
        """Backward of `loss.float() * loss_scale`; then (by default) `update_master_grads()`."""
        (loss.float() * self.loss_scaler.loss_scale()).backward(retain_graph=retain_graph)
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self) -> None:
        """Copy the model grads into the masters unscaled, and record whether they overflowed."""
        self.loss_scaler.clear_overflow_state()
        model_grads, master_grads = [], []
        for model, master in zip(self.all_fp16_params, self.all_fp32_from_fp16_params):
            if model.grad is not None:
                if master.grad is None:
                    master.grad = torch.empty_like(master)
                model_grads.append(model.grad)
                master_grads.append(master.grad)
        if model_grads:
            self.loss_scaler.unscale(model_grads, master_grads, self.loss_scaler.loss_scale())
        grads = [p.grad for p in self.all_fp32_from_fp32_params if p.grad is not None]
        if grads:
            self.loss_scaler.unscale(grads, grads, self.loss_scaler.loss_scale(), models_are_masters=True)
        self.overflow = self.loss_scaler.update_scale()

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Step the masters and copy them to the model; skip (and log) when the grads overflowed."""
        if self.overflow:
            if self.dynamic_loss_scale:
                log.warning("Gradient overflow.  Skipping step, reducing loss scale to %s", self.loss_scale)
            else:
                log.warning("Gradient overflow.  Skipping step (static loss scale %s, unchanged)", self.loss_scale)
            return None
        if closure is None:
            self._check_masters_have_grads()
        result = self._step_with_closure(closure) if closure is not None else self.optimizer.step()
        self._master_params_to_model_params()
        return result

    def _check_masters_have_grads(self) -> None:
        """A step whose fp16 params have grads while their fp32 masters have none would change nothing (apex
        stepped silently): the grads came from `loss.backward()`, which FP16_Optimizer never sees."""
        masters = self.all_fp32_from_fp16_params
        if masters and all(master.grad is None for master in masters) and any(
                param.grad is not None for param in self.all_fp16_params):
            raise RuntimeError("FP16_Optimizer.step(): the fp16 model params have grads but their fp32 master "
                               "params have none, so this step would change nothing. Call "
                               "optimizer.backward(loss) instead of loss.backward() (it scales the loss and "
                               "copies the grads to the masters), or optimizer.update_master_grads() after "
                               "optimizer.backward(loss, update_master_grads=False).")

    def _step_with_closure(self, closure: Callable[[], Any]) -> Any:
        def wrapped() -> Any:
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:
                self._master_params_to_model_params()  # the closure must see the optimizer's trial weights
            loss = closure()
            while self.overflow:
                log.warning("OVERFLOW within closure! Skipping step, reducing loss scale to %s", self.loss_scale)
                loss = closure()
            return loss

        result = self.optimizer.step(wrapped)
        self.first_closure_call_this_step = True
        return result

    def _master_params_to_model_params(self) -> None:
        with torch.no_grad():
            for model, master in zip(self.all_fp16_params, self.all_fp32_from_fp16_params):
                model.copy_(master)

    def clip_master_grads(self, max_norm: float, norm_type: float = 2) -> Any:
        """Clip the master grads; returns their total norm (torch's result), or -1 when the grads overflowed."""
        if self.overflow:
            return -1
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return self.clip_grad_norm(params, max_norm, norm_type)

    def inspect_master_grad_data(self) -> Optional[List[List[Optional[torch.Tensor]]]]:
        """The master grads per group (None where a param has none); None while the grads overflowed."""
        if self.overflow:
            log.warning("FP16_Optimizer.inspect_master_grad_data called while in an overflow state: the grads are "
                        "invalid (inf, nan or stale); returning None.")
            return None
        return [[None if p.grad is None else p.grad.data for p in group["params"]]
                for group in self.optimizer.param_groups]

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "loss_scaler": self.loss_scaler,
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": self.fp32_from_fp16_groups,
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads apex's and apexlite's state dicts; apex's pickled scaler objects, pre-2019 ones included,
        become a live scaler with the saved scale and schedule (anything else is refused here)."""
        self.loss_scaler = restore_loss_scaler(state_dict["loss_scaler"])
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for current, saved in zip(self.fp32_from_fp16_groups, state_dict["fp32_from_fp16"]):
                for master, value in zip(current, saved):
                    master.copy_(value)
        self._master_params_to_model_params()

    # --- forwarded optimizer attributes ---------------------------------------------------------
    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale()

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self.loss_scaler._loss_scale = value

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


__getattr__ = generic.fallback_getattr(__name__)
