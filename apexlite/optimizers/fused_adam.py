"""``FusedAdam``: apex's drop-in Adam/AdamW with one fused, mixed-precision step on CPU and CUDA."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch

from apexlite._logging import get_logger
from apexlite.optimizers import _adam_state as adam_state
from apexlite.optimizers import multi_tensor
from apexlite.optimizers._base import ApexStyleOptimizer
from apexlite.optimizers._adam_step import IMPLEMENTATIONS, bump_versions, fused_adam_step
from apexlite.optimizers._grad_writeback import check_grads_writable
from apexlite.optimizers._torch_fused import Workspace, foreach_copy

_LEGACY_STEP_ARGS = ("grads", "output_params", "scale", "grad_norms")
_log = get_logger("optimizers")


def _check_hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> None:
    if isinstance(lr, torch.Tensor):
        raise TypeError("FusedAdam takes lr as a Python float; pass float(lr) (a tensor lr is not supported).")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr} (must be >= 0)")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps} (must be >= 0)")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"Invalid betas: {betas} (need two values, each in [0, 1))")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay} (must be >= 0)")


def _flag_on(value: Union[None, float, torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    """A GradScaler-style flag (scale or found_inf) as a float32 tensor on ``device``, or None.

    A Python number becomes a device tensor by a fill, with no host-to-device copy.
    """
    if value is None:
        return None
    if torch.is_tensor(value):
        return value.to(device=device, dtype=torch.float32, non_blocking=True)
    return torch.full((1,), float(value), dtype=torch.float32, device=device)


class FusedAdam(ApexStyleOptimizer):
    r"""Adam and AdamW with apex's constructor, running one fused update per (device, dtype) group.

    For each parameter with a gradient, at step :math:`t`:

    .. math::
        \begin{aligned}
        g_t &\leftarrow \nabla_\theta / s && s: \text{grad\_scale (1 when unset)} \\
        g_t &\leftarrow g_t + \lambda\theta_{t-1} && \text{if not adam\_w\_mode (L2)} \\
        \theta_{t-1} &\leftarrow \theta_{t-1}(1 - \gamma\lambda) && \text{if adam\_w\_mode (decoupled)} \\
        m_t &\leftarrow \beta_1 m_{t-1} + (1-\beta_1) g_t \\
        v_t &\leftarrow \beta_2 v_{t-1} + (1-\beta_2) g_t^2 \\
        \theta_t &\leftarrow \theta_{t-1} - \frac{\gamma}{1-\beta_1^t}\,
            \frac{m_t}{\sqrt{v_t}/\sqrt{1-\beta_2^t} + \epsilon}
        \end{aligned}

    (bias corrections are 1 when ``bias_correction=False``). The math is float32 whatever the storage
    dtypes. Results match ``torch.optim.Adam`` (``adam_w_mode=False``) or ``torch.optim.AdamW``
    (``adam_w_mode=True``, apex's default) to float32 rounding.

    Args:
        params: parameters or param groups, as for any torch optimizer.
        lr (float, default 1e-3), betas (default (0.9, 0.999)), eps (default 1e-8),
            weight_decay (default 0): the usual Adam hyper-parameters; bad values raise ``ValueError``.
        bias_correction (bool, default True): divide by :math:`1-\beta^t` as Adam does.
        adam_w_mode (bool, default True): decoupled weight decay (AdamW) instead of L2.
        amsgrad (bool): must stay False; AMSGrad is not implemented and raises ``RuntimeError``.
        set_grad_none (bool, default True): what :meth:`zero_grad` does when not told.
        capturable (bool): accepted for apex compatibility. The CUDA kernel never synchronises with
            the host in any mode (steps, scale and found_inf stay on the device).
        master_weights (bool, default False): keep fp32 master weights for fp16/bf16 params (below).
        exp_avg_dtype (keyword, default float32): storage of both moments, float32 or bfloat16
            (halves their memory; the math stays float32).
        implementation (keyword, default "auto"): "auto" (apexlite's compiled kernel if built, else
            torch's own fused Adam ops, else the pure-torch reference with one warning), "kernel"
            (error if not built), "torch" (torch's fused ops; error where this torch has none for
            the device) or "reference" (pure torch, the test oracle). Params whose elements do not
            fill one dense block (e.g. a strided view) always take the reference path.

    State per param: ``step`` (float32 scalar tensor), ``exp_avg``, ``exp_avg_sq`` (torch's names,
    so checkpoints load across torch, apex and apexlite; apex's per-group ``step`` is converted on
    load) and ``master_param`` with master weights.

    .. note:: **Mixed precision.** Gradients may be float32, float16 or bfloat16 independently of the
       params (e.g. fp32 params whose ``Tensor.grad_dtype`` is bfloat16): the kernel reads them as
       they are. Without master weights an fp16/bf16 param is updated in float32 registers and
       rounded back, which stalls once updates drop below its precision.

    .. note:: **(a) Master weights.** With ``master_weights=True`` every fp16/bf16 param gets a
       float32 master in ``state[p]["master_param"]`` (so it travels in :meth:`state_dict`) and
       float32 moments. The fused step updates the master and writes the rounded fp16/bf16 copy into
       the param in the same pass. float32 params are updated directly. Works on CPU and CUDA.

    .. note:: **(b) Switching on later.** :meth:`enable_master_weights` turns master weights on for an
       optimizer built before its model was cast to half precision, optionally seeding each master
       from the fp32 weights saved before the cast.

    .. note:: **(c) Loss scaling.** ``step()`` reads two optional attributes, GradScaler's contract
       for optimizers with ``_step_supports_amp_scaling``: ``self.grad_scale`` (1-element float32
       tensor holding the loss *scale*; gradients are multiplied by its reciprocal in registers, and
       the unscaled gradient is stored back into ``.grad``, in place, as torch's fused Adam leaves it;
       a grad laid out unlike its param, e.g. the grad of a contiguous conv weight fed channels_last
       input, is read through a copy in the param's layout whose unscaled values are copied back,
       and a grad whose elements share memory (``expand``) is refused with ``RuntimeError`` before
       anything changes, as torch's unscale refuses it) and
       ``self.found_inf`` (1-element float32 tensor; nonzero skips the whole step: params, masters,
       moments, ``step`` and ``.grad``, still scaled, stay bit-identical). ``torch.amp.GradScaler``
       sets and deletes them around its ``scaler.step(optimizer)``; apexlite's amp sets them the same
       way. They stay in effect until deleted. Setting ``leave_grads_scaled = True`` on the instance
       skips the write-back (one pass less over the grads) for callers that never read ``.grad``
       after the step; apexlite's amp O2 does so, as apex's O2 left the model's grads scaled.

    .. note:: **(d) amp O2.** Under ``amp.initialize(..., opt_level="O2")`` this optimizer keeps the
       model's half params in its groups and their fp32 masters in its state; the grad unscale, the
       master update and the half copy happen in this step (no fp32 grad copies). Set
       ``amp_fused_master_step = False`` on the instance before ``amp.initialize`` to get apex's
       separate fp32 master params instead. A master's own ``.grad`` (fp32, unscaled), when set, is
       used in place of its param's grad and ``grad_scale`` does not apply to it: amp sets it when
       grads are clipped through ``amp.master_params`` or accumulated over several backward passes.

    .. note:: **(e) Version counters.** After a fused kernel (apexlite's or torch's) writes a param,
       its autograd version counter is bumped (``torch.autograd.graph.increment_version``), so
       caches keyed on ``Tensor._version`` (amp's cast cache) see the new values.

    .. note:: **(f) Checkpoints across opt levels.** A checkpoint with fp32 master weights (amp O2,
       ``master_weights=True``) loaded for float32 params (an O0/O1 run, whose params are their own
       masters) hands each master to its param: the param takes the master's values and the state
       keeps no master, so training continues from the full-precision weights.
    """

    _step_supports_amp_scaling = True
    # with grad_scale set: False stores the unscaled grads into .grad (GradScaler's contract), True skips it
    leave_grads_scaled = False
    # under amp O2, keep the fp32 masters here and unscale in the kernel (apexlite/amp/fused_master.py)
    amp_fused_master_step = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
        *,
        exp_avg_dtype: torch.dtype = torch.float32,
        implementation: str = "auto",
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not implement AMSGrad; use torch.optim.Adam(amsgrad=True).")
        _check_hyper(lr, betas, eps, weight_decay)
        if exp_avg_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"exp_avg_dtype must be torch.float32 or torch.bfloat16, got {exp_avg_dtype}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=bool(adam_w_mode))
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        self.master_weights = master_weights
        self.exp_avg_dtype = exp_avg_dtype
        self.implementation = implementation
        self._workspace = Workspace()  # scratch of the torch fused path, reused between steps
        # apex's instance attributes, which subclasses written against apex read (e.g. fairseq's
        # FusedAdamV2 calls self.multi_tensor_adam itself); each group also carries its adam_w_mode
        self.adam_w_mode = 1 if adam_w_mode else 0
        self._make_overflow_buf()
        self.multi_tensor_adam = multi_tensor.multi_tensor_adam
        self.multi_tensor_adam_capturable = multi_tensor.multi_tensor_adam_capturable
        self.multi_tensor_adam_capturable_master = multi_tensor.multi_tensor_adam_capturable_master

    @property
    def param_groups_master(self) -> List[Dict[str, List[Optional[torch.Tensor]]]]:
        """apex's view of the masters: per group, each param's fp32 master or None."""
        return [{"params": [self.state[p].get("master_param") if p in self.state else None
                            for p in group["params"]]} for group in self.param_groups]

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Adds a group (torch semantics); its hyper-parameters are validated like the constructor's."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])

    def enable_master_weights(self, initial_masters: Optional[Mapping[torch.Tensor, torch.Tensor]] = None) -> None:
        """Switches master weights on for an optimizer whose params are (now) fp16/bf16.

        Args:
            initial_masters: optional mapping param -> tensor with the values each master should
                start from (e.g. the fp32 weights saved before ``model.half()``); other half params
                start from their current values. Entries for float32 params are ignored, as those
                params are their own masters.
        """
        initial = dict(initial_masters or {})
        known = {id(p) for group in self.param_groups for p in group["params"]}
        strangers = [tuple(t.shape) for t in initial if id(t) not in known]
        if strangers:
            raise ValueError(f"initial_masters has keys that are not params of this optimizer (shapes {strangers})")
        self.master_weights = True
        for group in self.param_groups:
            for param in group["params"]:
                if param.dtype not in adam_state.HALF_DTYPES:
                    continue
                source = initial.get(param, param)
                if source.shape != param.shape:
                    raise ValueError(f"initial master of shape {tuple(source.shape)} for a param of shape "
                                     f"{tuple(param.shape)}; pass the pre-cast tensor of the same param")
                self.state[param]["master_param"] = adam_state.fp32_copy(source, param)
                adam_state.prepare_state(param, self.state[param])

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads torch, apex or apexlite checkpoints, keeping FusedAdam's state dtypes and devices."""
        if any(group.get("amsgrad") for group in state_dict["param_groups"]):
            raise RuntimeError("this checkpoint comes from an AMSGrad optimizer; FusedAdam does not implement "
                               "AMSGrad, load it into torch.optim.Adam(amsgrad=True) instead.")
        ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        by_id = dict(zip(ids, params))
        adam_state.check_checkpoint_shapes(state_dict["state"], by_id)
        super().load_state_dict(state_dict)
        handed_over = 0
        for pid, saved in state_dict["state"].items():
            param = by_id.get(pid)
            if param is None:
                continue
            for key, value in saved.items():
                if torch.is_tensor(value):
                    self.state[param][key] = adam_state.restore_value(key, value, param, self.exp_avg_dtype)
            handed_over += adam_state.hand_master_to_fp32_param(param, self.state[param])
            adam_state.prepare_state(param, self.state[param])
        if handed_over:
            _log.info("FusedAdam.load_state_dict: the checkpoint holds fp32 master weights (amp O2 or "
                      "master_weights=True) for %d float32 params (amp O0/O1); each param took its master's "
                      "values and keeps no separate master", handed_over)
        for group in self.param_groups:
            for key, default in self.defaults.items():  # torch checkpoints lack FusedAdam's own keys
                group.setdefault(key, default)
            # apex keeps one step count per group; a subclass with its own step() (e.g. fairseq's) still reads it
            group_step = group.pop("step", None) if self._steps_itself() else None
            for param in group["params"]:
                state = self.state.get(param)
                if group_step is not None and state and "step" not in state:
                    state["step"] = torch.tensor(float(group_step), device=param.device)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, **legacy: Any) -> Any:
        """Performs one optimisation step; returns the closure's loss when a closure is given."""
        self._reject_legacy_arguments(legacy)
        loss = self._closure_loss(closure)
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        store_unscaled = grad_scale is not None and not self.leave_grads_scaled
        plan = [(group, self._buckets(group)) for group in self.param_groups]
        if store_unscaled:  # before anything is updated
            check_grads_writable((pair for _, buckets in plan for bucket in buckets.values()
                                  if not bucket.grads_unscaled for pair in bucket.unlike_params), "FusedAdam")
        for group, buckets in plan:
            beta1, beta2 = group["betas"]
            for bucket in buckets.values():
                bucket_scale = None if bucket.grads_unscaled else _flag_on(grad_scale, bucket.device)
                path = fused_adam_step(
                    bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs,
                    bucket.state_steps, bucket.model_copies,
                    lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                    weight_decay=group["weight_decay"], bias_correction=group["bias_correction"],
                    adam_w_mode=group["adam_w_mode"], grad_scale=bucket_scale,
                    found_inf=_flag_on(found_inf, bucket.device),
                    unscale_grads=not self.leave_grads_scaled,
                    implementation=self.implementation if bucket.dense else "reference",
                    workspace=self._workspace,
                )
                if path != "reference":  # fused ops write through raw pointers, bypassing the counters
                    bump_versions(bucket.written)
                if bucket.odd_grads and bucket_scale is not None and store_unscaled:  # into .grad itself (note c)
                    foreach_copy(bucket.odd_grads, bucket.odd_grad_copies)
        return loss

    def _buckets(self, group: Dict[str, Any]) -> Dict[Tuple, adam_state.Bucket]:
        buckets: Dict[Tuple, adam_state.Bucket] = {}
        for param in group["params"]:
            grad, unscaled = adam_state.step_grad(param, self.state.get(param))
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("FusedAdam does not support sparse gradients; use torch.optim.SparseAdam "
                                   f"for this param (shape {tuple(param.shape)}).")
            adam_state.check_dtype(param, "param")
            adam_state.check_dtype(grad, "gradient")
            if grad.device != param.device:
                raise RuntimeError(f"a gradient is on {grad.device} but its param is on {param.device}; "
                                   "move the gradient to the param's device before step().")
            state = self.state[param]
            adam_state.init_state(param, state, self.master_weights, self.exp_avg_dtype)
            adam_state.add_to_bucket(buckets, param, grad, state, unscaled)
        return buckets

    def _steps_itself(self) -> bool:
        """Whether step() is FusedAdam's own (torch wraps each class's step for profiling, hence unwrap)."""
        return inspect.unwrap(type(self).step) is inspect.unwrap(FusedAdam.step)

    @staticmethod
    def _reject_legacy_arguments(legacy: Dict[str, Any]) -> None:
        unknown = sorted(set(legacy) - set(_LEGACY_STEP_ARGS) - {"grad_scaler"})
        if unknown:
            raise TypeError(f"FusedAdam.step() got unexpected keyword arguments {unknown}")
        if any(legacy.get(name) is not None for name in _LEGACY_STEP_ARGS):
            raise RuntimeError("FusedAdam.step() no longer takes grads/output_params/scale/grad_norms: "
                               "build it like torch.optim.Adam and call step() without them.")
        if legacy.get("grad_scaler") is not None:
            raise RuntimeError("FusedAdam.step(grad_scaler=...) is not supported: call scaler.step(optimizer), "
                               "which hands the scale and found_inf to FusedAdam.")
