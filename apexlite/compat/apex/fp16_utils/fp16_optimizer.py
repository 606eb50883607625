"""`apex.fp16_utils.FP16_Optimizer`: manual fp16 training with fp32 master weights and loss scaling.

The wrapped optimizer's fp16/bf16 params are replaced, in its param groups, by fp32 master copies
(as amp's O2 does); `backward` scales the loss, `update_master_grads` copies and unscales grads into
the masters and checks for overflow with amp's LossScaler, `step` skips on overflow and otherwise
steps the masters and copies them back into the model.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.scaler import LossScaler
from apexlite.compat import generic

log = get_logger("fp16_utils")
_LOW = (torch.float16, torch.bfloat16)


class FP16_Optimizer:
    """Wraps `init_optimizer`; static scale `static_loss_scale`, or dynamic (2**16, x2 per 2000 clean steps)."""

    def __init__(self, init_optimizer: torch.optim.Optimizer, static_loss_scale: float = 1.0,
                 dynamic_loss_scale: bool = False, dynamic_loss_args: Optional[Dict[str, Any]] = None,
                 verbose: bool = True) -> None:
        self.optimizer = init_optimizer
        self.verbose = verbose
        self.pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (model param, fp32 master)
        self.fp32_params: List[torch.Tensor] = []
        for index, group in enumerate(init_optimizer.param_groups):
            if verbose:
                log.info("FP16_Optimizer processing param group %d:", index)
            group["params"] = [self._master_for(param) for param in group["params"]]
        init_optimizer.load_state_dict(init_optimizer.state_dict())  # recast existing state to fp32
        self.dynamic_loss_scale = dynamic_loss_scale
        self.loss_scaler = (LossScaler("dynamic", **(dynamic_loss_args or {})) if dynamic_loss_scale
                            else LossScaler(static_loss_scale))
        self.overflow = False
        self.first_closure_call_this_step = True

    def _master_for(self, param: torch.Tensor) -> torch.Tensor:
        if not param.requires_grad:
            return param
        if param.dtype in _LOW:
            if self.verbose:
                log.info("FP16_Optimizer received %s with %s", param.dtype, tuple(param.shape))
            master = torch.nn.Parameter(param.detach().clone().float())
            if param in self.optimizer.state:
                self.optimizer.state[master] = self.optimizer.state.pop(param)
            self.pairs.append((param, master))
            return master
        if param.dtype is torch.float32:
            self.fp32_params.append(param)
            return param
        raise TypeError(f"Wrapped parameters must be fp32, fp16 or bf16 tensors. Received {param.dtype}")

    # --- training loop -------------------------------------------------------------------------
    def zero_grad(self, set_grads_to_None: bool = False) -> None:
        """Clear model and master grads (to None when `set_grads_to_None`)."""
        for param in [p for pair in self.pairs for p in pair] + self.fp32_params:
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
        """Copy model grads to the masters, unscale them and record whether they overflowed."""
        self.loss_scaler.clear_overflow_state()
        for model, master in self.pairs:
            master.grad = None if model.grad is None else model.grad.detach().float()
        grads = [p.grad for _, p in self.pairs if p.grad is not None]
        grads += [p.grad for p in self.fp32_params if p.grad is not None]
        if grads and self.loss_scaler.checks_overflow:
            self.loss_scaler.unscale(grads)
        self.overflow = self.loss_scaler.update_scale()

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Step the masters and copy them to the model; skip (and log) when the grads overflowed."""
        if closure is not None:
            return self._step_with_closure(closure)
        if self.overflow:
            log.warning("Gradient overflow.  Skipping step, reducing loss scale to %s", self.loss_scale)
            return None
        result = self.optimizer.step()
        self._masters_to_model()
        return result

    def _step_with_closure(self, closure: Callable[[], Any]) -> Any:
        def wrapped() -> Any:
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:
                self._masters_to_model()  # the closure must see the optimizer's trial weights
            loss = closure()
            while self.overflow:
                log.warning("OVERFLOW within closure! Skipping step, reducing loss scale to %s", self.loss_scale)
                loss = closure()
            return loss

        result = self.optimizer.step(wrapped)
        self.first_closure_call_this_step = True
        self._masters_to_model()
        return result

    def _masters_to_model(self) -> None:
        with torch.no_grad():
            for model, master in self.pairs:
                model.copy_(master)

    def clip_master_grads(self, max_norm: float, norm_type: float = 2) -> float:
        """Clip the master grads; returns their total norm, or -1 when the grads overflowed."""
        if self.overflow:
            return -1
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type))

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "loss_scaler": self.loss_scaler,
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": [[master for _, master in self.pairs]],
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.loss_scaler = state_dict["loss_scaler"]
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        saved = [t for group in state_dict["fp32_from_fp16"] for t in group]
        with torch.no_grad():
            for (_, master), value in zip(self.pairs, saved):
                master.copy_(value)
        self._masters_to_model()

    def __getstate__(self) -> None:
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

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

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        return self.optimizer.param_groups


__getattr__ = generic.fallback_getattr(__name__)
