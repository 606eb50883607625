"""``FusedMixedPrecisionLamb``: apex's LAMB for reduced-precision params, with fp32 masters inside it.

The update rule is FusedLAMB's (this class extends it). What apex's mixed-precision variant adds:

- params of ``reduced_precision_dtype`` (e.g. bf16) get an fp32 master copy and fp32 moments, made at
  the first step (after DDP may have synchronised the params); the update runs on the master and
  the param receives its rounded copy;
- ``lr`` and ``step`` are tensors on the params' device (``group["lr"]``, ``group["step"]``), so a
  step needs no host sync and the step count survives CUDA graphs;
- it takes part in ``torch.amp.GradScaler``: gradients are unscaled inside the step and a step with
  inf/NaN gradients changes nothing (params, moments, masters, step count).
"""
from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from apexlite.optimizers import multi_tensor
from apexlite.optimizers._grad_writeback import check_grads_writable
from apexlite.optimizers._lamb_rule import lamb_update
from apexlite.optimizers.fused_lamb import FusedLAMB

_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB with apex's ``FusedMixedPrecisionLamb`` constructor, fp32 masters and tensor lr/step.

    Args as apex: ``params``, ``lr=1e-3``, ``step=0`` (initial step count), ``bias_correction=True``,
    ``betas=(0.9, 0.999)``, ``eps=1e-6``, ``weight_decay=0.01``, ``amsgrad=False`` (True raises),
    ``adam_w_mode=True``, ``grad_averaging=True``, ``max_grad_norm=1.0``, ``use_nvlamb=False``,
    ``reduced_precision_dtype=None``. Setting ``optimizer.reduced_precision_dtype`` before the first
    step works too (apex's own test does that).

    .. note:: Params of another low-precision dtype keep moments in that dtype (apex's rule); the math
       is fp32 throughout. Masters live in ``optimizer.state[p]["master_param"]``, so
       ``state_dict()`` carries them and a resumed run continues from the exact fp32 values (apex kept
       them outside the state and re-made them from the rounded params). ``load_state_dict`` keeps
       every saved state tensor's dtype.

    .. note:: Under ``torch.amp.GradScaler`` (``scaler.step(optimizer)``) the step divides the
       gradients by the scale itself and writes the unscaled gradients back to ``.grad`` (apex left its
       update direction there); skipping an overflowing step reads ``found_inf`` once on the host.
       ``step(grad_scaler=scaler)``, apex's calling form, works as well.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, step: int = 0, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 max_grad_norm: float = 1.0, use_nvlamb: bool = False,
                 reduced_precision_dtype: Optional[torch.dtype] = None) -> None:
        if reduced_precision_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(f"reduced_precision_dtype must be None, torch.float16 or torch.bfloat16; "
                             f"got {reduced_precision_dtype}.")
        self.reduced_precision_dtype = reduced_precision_dtype
        super().__init__(params, lr=float(lr), bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adam_w_mode=adam_w_mode,
                         grad_averaging=grad_averaging, set_grad_none=True, max_grad_norm=max_grad_norm,
                         use_nvlamb=use_nvlamb)
        self.multi_tensor_l2norm = multi_tensor.multi_tensor_l2norm_mp
        self.multi_tensor_lamb = multi_tensor.multi_tensor_lamb_mp
        self.defaults["lr"] = torch.tensor(float(lr), dtype=torch.float32)
        self.defaults["step"] = torch.tensor([int(step)], dtype=torch.int32)
        for group in self.param_groups:
            self._tensor_hyperparameters(group, lr=float(lr), step=int(step))

    @staticmethod
    def _tensor_hyperparameters(group: Dict[str, Any], lr: Any, step: Any) -> None:
        """`lr` (0-d fp32) and `step` (shape (1,) int32) as tensors on the group's device, one per group."""
        device = group["params"][0].device if group["params"] else torch.device("cpu")
        group["lr"] = torch.as_tensor(lr, dtype=torch.float32).detach().clone().to(device)
        group["step"] = torch.as_tensor(step, dtype=torch.int32).detach().clone().reshape(1).to(device)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """As torch's, but the new group gets its own lr/step tensors (never shared with another group)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if "step" in self.defaults:  # (absent while the base constructor adds the first groups)
            self._tensor_hyperparameters(group, group["lr"], group.get("step", self.defaults["step"]))

    @property
    def param_groups_full_precision(self) -> List[Dict[str, List[Optional[torch.Tensor]]]]:
        """apex's view of the masters: per group, each param's fp32 master or None."""
        return [{"params": [self.state[p].get("master_param") if p in self.state else None
                            for p in group["params"]]} for group in self.param_groups]

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's loading, keeping each saved tensor's dtype (fp32 masters/moments of bf16 params)."""
        super().load_state_dict(state_dict)
        saved_ids = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        params = chain.from_iterable(group["params"] for group in self.param_groups)
        for saved_id, param in zip(saved_ids, params):
            for key, saved in state_dict["state"].get(saved_id, {}).items():
                if isinstance(saved, torch.Tensor):
                    self.state[param][key] = saved.detach().to(param.device, copy=True)
        for group in self.param_groups:
            self._tensor_hyperparameters(group, group["lr"], group["step"])

    def _scaling(self, grad_scaler: Any, device: torch.device) -> Tuple[Optional[torch.Tensor], bool]:
        """(1/loss scale or None, whether this step overflowed), from GradScaler's two calling forms."""
        if grad_scaler is not None:  # apex's form: step(grad_scaler=scaler)
            found_inf = grad_scaler._check_inf_per_device(self)[device]
            stage = grad_scaler._per_optimizer_states[id(self)]["stage"]
            scale = None if stage.name == "UNSCALED" else grad_scaler._get_scale_async()
        else:  # torch's form: scaler.step(optimizer) sets these attributes around step()
            found_inf, scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        overflow = found_inf is not None and bool(found_inf.item())
        inv_scale = None if scale is None else scale.double().reciprocal().float().to(device).reshape(())
        return inv_scale, overflow

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
        """One LAMB step over every group (see the class docstring); returns the closure's loss."""
        grad_scaler = kwargs.pop("grad_scaler", None)
        if kwargs:
            raise TypeError(f"FusedMixedPrecisionLamb.step() got unexpected keyword arguments {sorted(kwargs)}")
        loss = self._closure_loss(closure)
        with_grads = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not with_grads:
            return loss
        device = with_grads[0].device
        inv_scale, overflow = self._scaling(grad_scaler, device)
        if inv_scale is not None:  # the unscaled grads are stored back in place, so check them all first
            check_grads_writable(((p, p.grad) for p in with_grads), type(self).__name__)
        if overflow:
            return loss
        grads = {p: self._unscaled_grad(p, inv_scale) for p in with_grads}
        norms = torch._foreach_norm(list(grads.values()), 2.0)
        global_norm = torch.stack([n.to(device) for n in norms]).norm(2)
        for group in self.param_groups:
            self._step_mp_group(group, grads, global_norm)
        return loss

    def _unscaled_grad(self, param: torch.Tensor, inv_scale: Optional[torch.Tensor]) -> torch.Tensor:
        if param.grad.is_sparse:
            raise RuntimeError("FusedMixedPrecisionLamb does not support sparse gradients.")
        if param.dtype not in _SUPPORTED_DTYPES:
            raise RuntimeError(f"FusedMixedPrecisionLamb supports fp16, bf16 and fp32 parameters; got {param.dtype}.")
        grad = param.grad.float()
        if inv_scale is not None:
            grad = grad * inv_scale.to(grad.device)
            param.grad.copy_(grad)
        return grad

    def _master_and_state(self, param: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """The fp32 values the update runs on (master or the param itself) and the param's state."""
        state = self.state[param]
        reduced = self.reduced_precision_dtype is not None and param.dtype == self.reduced_precision_dtype
        if not state:
            moment_dtype = torch.float32 if reduced else param.dtype
            state["exp_avg"] = torch.zeros_like(param, dtype=moment_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=moment_dtype, memory_format=torch.preserve_format)
        if reduced and "master_param" not in state:
            state["master_param"] = param.detach().float().clone()
        return state.get("master_param", param), state

    def _step_mp_group(self, group: Dict[str, Any], grads: Dict[torch.Tensor, torch.Tensor],
                       global_norm: torch.Tensor) -> None:
        params = [p for p in group["params"] if p in grads]
        if not params:
            return
        device = params[0].device
        group["step"] = torch.as_tensor(group["step"], dtype=torch.int32, device=device).reshape(1)
        group["step"] += 1
        targets, states = zip(*(self._master_and_state(p) for p in params))
        beta1, beta2 = group["betas"]
        lamb_update([grads[p] for p in params], list(targets), [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [p if target is not p else None for p, target in zip(params, targets)],
                    lr=torch.as_tensor(group["lr"], dtype=torch.float32, device=device).reshape(()),
                    beta1=beta1, beta2=beta2, eps=group["eps"], step=group["step"],
                    bias_correction=group["bias_correction"], weight_decay=group["weight_decay"],
                    grad_averaging=group["grad_averaging"], adam_w_mode=bool(self.adam_w_mode),
                    global_grad_norm=global_norm, max_grad_norm=self.defaults["max_grad_norm"],
                    use_nvlamb=self.use_nvlamb)
