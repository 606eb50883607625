"""``FusedAdam``: apex's drop-in Adam/AdamW with one fused, mixed-precision step on CPU and CUDA."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from apexlite.optimizers import _adam_checkpoint as checkpoint
from apexlite.optimizers import _adam_state as adam_state
from apexlite.optimizers import multi_tensor
from apexlite.optimizers._base import ApexStyleOptimizer, check_hyper, clear_grads
from apexlite.optimizers._adam_step import (IMPLEMENTATIONS, bump_versions, flag_on, fused_adam_flat_grad_list_step,
                                            fused_adam_flat_step, fused_adam_step, resolve)
from apexlite.optimizers._flat_buffers import FlatBuffers
from apexlite.optimizers._grad_writeback import check_grads_writable
from apexlite.optimizers._group_steps import (
    GroupStart, ParamGroup, check_step_count)
from apexlite.optimizers._torch_fused import Workspace, foreach_copy

_LEGACY_STEP_ARGS = ("grads", "output_params", "scale", "grad_norms")


class FusedAdam(ApexStyleOptimizer):
    r"""Adam (``adam_w_mode=False``) and AdamW (``True``, apex's default) with apex's constructor: one fused
    step in float32 math, matching ``torch.optim.Adam`` / ``AdamW`` to float32 rounding, on CPU and CUDA.

    Each param group's params and state live in a few flat buffers (one per device, dtypes and step
    count), so a step is one kernel call per buffer (at most 8 on a GPU) whatever the number of tensors;
    the params stay the same objects and ``state_dict()`` keeps torch's per-param format.
    ``flat_buffers=False`` keeps every tensor where it is (one call over tensor lists). Full notes:
    docs/fused_adam.md.

    Args:
        params, lr (1e-3), betas ((0.9, 0.999)), eps (1e-8), weight_decay (0): as torch.optim.Adam.
        bias_correction (True), adam_w_mode (True): apex's switches.
        amsgrad: must stay False (AMSGrad is not implemented; True raises ``RuntimeError``).
        set_grad_none (True): what :meth:`zero_grad` does when not told.
        capturable: accepted for apex; no step ever waits for the device.
        master_weights (False): fp32 masters for fp16/bf16 params, updated with their half copies in one pass.
        exp_avg_dtype (float32): moments in float32 or bfloat16.
        implementation ("auto"): "kernel", "torch" (torch's fused ops), "reference" (pure torch) or "auto".
        flat_buffers (True): keep params and state in flat buffers (docs/fused_adam.md).
        step_count ("group"): apex's rule, every step() advances the step count of all the group's params;
            "param" is torch.optim.Adam's, only params with a grad (they differ only for a param that gets
            grads on some steps only: _group_steps.py).

    State per param: ``step``, ``exp_avg``, ``exp_avg_sq`` (torch's names) and ``master_param``. Under
    ``torch.amp.GradScaler`` (or apexlite's amp) ``step()`` reads ``grad_scale``/``found_inf`` and
    unscales in the kernel, storing the unscaled grads into ``.grad`` unless ``leave_grads_scaled``.
    """

    _step_supports_amp_scaling = True
    # with grad_scale set: False stores the unscaled grads into .grad (GradScaler's contract), True skips it
    leave_grads_scaled = False
    # under amp O2, keep the fp32 masters here and unscale in the kernel (apexlite/amp/fused_master.py)
    amp_fused_master_step = True
    # set by amp O2 for a step: grad_scale applies to the half params' grads only, amp unscaled the fp32 ones
    amp_fp32_grads_unscaled = False

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
        flat_buffers: bool = True,
        step_count: str = "group",
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not implement AMSGrad; use torch.optim.Adam(amsgrad=True).")
        check_hyper(lr, betas, eps, weight_decay, "FusedAdam")
        if exp_avg_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"exp_avg_dtype must be torch.float32 or torch.bfloat16, got {exp_avg_dtype}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=bool(adam_w_mode),
                        step_count=check_step_count(step_count))
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        self.master_weights = master_weights
        self.exp_avg_dtype = exp_avg_dtype
        self.implementation = implementation
        self.flat_buffers = flat_buffers
        self._make_caches()
        # apex's instance attributes, which subclasses written against apex read (e.g. fairseq's
        # FusedAdamV2 calls self.multi_tensor_adam itself); each group also carries its adam_w_mode
        self.adam_w_mode = 1 if adam_w_mode else 0
        self._make_overflow_buf()
        self.multi_tensor_adam = multi_tensor.multi_tensor_adam
        self.multi_tensor_adam_capturable = multi_tensor.multi_tensor_adam_capturable
        self.multi_tensor_adam_capturable_master = multi_tensor.multi_tensor_adam_capturable_master

    def _caches(self) -> Tuple[str, ...]:
        return ("_workspace", "_flat", "_listing")

    def _make_caches(self) -> None:
        """The torch fused path's scratch, reused between steps, and the flat buffers (a copy builds its own
        from its params at its first step)."""
        self._workspace = Workspace()
        self._flat = FlatBuffers(enabled=self.flat_buffers)
        self._listing: Tuple[Tuple[int, int], ...] = ()  # the groups' lists at the last duplicate check

    @property
    def param_groups_master(self) -> List[Dict[str, List[Optional[torch.Tensor]]]]:
        """apex's view of the masters: per group, each param's fp32 master or None."""
        return [{"params": [self.state[p].get("master_param") if p in self.state else None
                            for p in group["params"]]} for group in self.param_groups]

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Adds a group (torch semantics); its hyper-parameters and params are validated first, as the constructor's."""
        given = {key: param_group.get(key, self.defaults.get(key)) for key in ("lr", "betas", "eps", "weight_decay")}
        check_hyper(**given, owner="FusedAdam")
        check_step_count(param_group.get("step_count", self.defaults["step_count"]))
        params = param_group["params"]
        if not isinstance(params, (torch.Tensor, set)):  # (torch refuses a set itself)
            param_group = {**param_group, "params": adam_state.listed_once(list(params))}
            adam_state.refuse_meta(param_group["params"])
        super().add_param_group(ParamGroup(param_group, self))

    def enable_master_weights(self, initial_masters: Optional[Mapping[torch.Tensor, torch.Tensor]] = None) -> None:
        """Switches master weights on for an optimizer whose params are (now) fp16/bf16.

        Args:
            initial_masters: optional mapping param -> tensor with the values each master should
                start from (e.g. the fp32 weights saved before ``model.half()``); other half params
                start from their current values. Entries for float32 params are ignored, as those
                params are their own masters.
        """
        adam_state.add_masters(self.param_groups, self.state, dict(initial_masters or {}))
        self.master_weights = True
        self._flat.invalidate()

    def state_dict(self) -> Dict[str, Any]:
        """torch's format with plain dicts; each group names its weight-decay mode in torch's key too."""
        return checkpoint.pack(super().state_dict(), self, self._steps_itself())

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads torch, apex or apexlite checkpoints, keeping FusedAdam's state dtypes and devices."""
        by_id = checkpoint.check_loadable(self, state_dict)
        built_modes = [group["adam_w_mode"] for group in self.param_groups]
        self._flat.invalidate()
        super().load_state_dict(state_dict)
        checkpoint.settle_loaded(self, state_dict, by_id, built_modes, self._steps_itself())

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """torch's (a copy, an unpickle, and load_state_dict all come here), with the groups as ParamGroups."""
        super().__setstate__(state)
        self.param_groups[:] = [ParamGroup(group, self) for group in self.param_groups]

    @torch._disable_dynamo
    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """torch's zero_grad (``set_to_none`` defaults to ``set_grad_none``), with no Python work per param in
        flat buffers: their grads are dropped, or zeroed in one fill per buffer (docs/fused_adam.md)."""
        set_to_none = self.set_grad_none if set_to_none is None else set_to_none
        foreach = bool(self.defaults.get("foreach", False) or self.defaults.get("fused", False))
        with torch.autograd.profiler.record_function(f"Optimizer.zero_grad#{type(self).__name__}.zero_grad"):
            for group in self.param_groups:
                clear_grads(self._flat.clear_grads(group, set_to_none), set_to_none, foreach)

    @torch._disable_dynamo  # torch.compile would trace the flat buffers' bookkeeping and drop its state writes
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, **legacy: Any) -> Any:
        """Performs one optimisation step; returns the closure's loss when a closure is given."""
        if legacy:
            self._reject_legacy_arguments(legacy)
        adam_state.refuse_maximize(self.param_groups, "a param group")
        listing = tuple((id(group["params"]), len(group["params"])) for group in self.param_groups)
        if listing != self._listing:  # a group's list was edited (or replaced) since the last step
            adam_state.listed_once_across(self.param_groups)
            adam_state.refuse_meta(p for group in self.param_groups for p in group["params"])
            self._listing = listing
        loss = self._closure_loss(closure)
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        store_unscaled = grad_scale is not None and not self.leave_grads_scaled
        fp32_unscaled = self.amp_fp32_grads_unscaled
        plan = []
        for group in self.param_groups:
            start = GroupStart(group, self.state) if group["step_count"] == "group" else None
            idle: List[torch.Tensor] = []
            flat_runs, rest = self._flat.plan(self, group, self._has_fused_path, self._has_kernel,
                                              start and start.give_counter)
            plan.append((group, flat_runs, self._buckets(rest, start, idle), start, idle))
        if store_unscaled:  # before anything is updated (flat grads are laid out like their params)
            self._check_unscaled_grads_writable(buckets for _, _, buckets, _, _ in plan)
        per_device: Dict[torch.device, Tuple[str, Optional[torch.Tensor], Optional[torch.Tensor]]] = {}
        for group, flat_runs, buckets, start, idle in plan:
            beta1, beta2 = group["betas"]
            hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                         weight_decay=group["weight_decay"], bias_correction=group["bias_correction"],
                         adam_w_mode=group["adam_w_mode"], unscale_grads=not self.leave_grads_scaled)
            late: List[torch.Tensor] = []
            for run in flat_runs:  # member versions are bumped by the grad checks (NOTE [flat grads])
                for call in run:
                    device = call.weights.device
                    if device not in per_device:
                        per_device[device] = (resolve(self.implementation, device), flag_on(grad_scale, device),
                                              flag_on(found_inf, device))
                    path, scale, found = per_device[device]
                    if fp32_unscaled and call.copies is None and call.weights.dtype == torch.float32:
                        scale = None  # fp32 params' own grads, which amp unscaled
                    if call.grads is not None:  # fresh grads read where they are (kernel path only)
                        fused_adam_flat_grad_list_step(call.weights, call.grads, call.offsets, call.exp_avg,
                                                       call.exp_avg_sq, call.steps, call.copies, grad_scale=scale,
                                                       found_inf=found, **hyper)
                        continue
                    fused_adam_flat_step(call.weights, call.grad, call.exp_avg, call.exp_avg_sq, call.steps,
                                         call.copies, path=path, workspace=self._workspace, grad_scale=scale,
                                         found_inf=found, **hyper)
                late += run.late
            per_tensor = list(buckets.values())
            if late:  # members a set stepped in pieces found unfit part-way (NOTE [flat grads])
                late_buckets = self._buckets(late, start, idle)
                if store_unscaled:
                    self._check_unscaled_grads_writable([late_buckets])
                per_tensor += late_buckets.values()
            for bucket in per_tensor:
                unscaled = bucket.grads_unscaled or (fp32_unscaled and not bucket.model_copies
                                                     and bucket.params[0].dtype == torch.float32)
                bucket_scale = None if unscaled else flag_on(grad_scale, bucket.device)
                path = fused_adam_step(
                    bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs,
                    bucket.state_steps, bucket.model_copies, grad_scale=bucket_scale,
                    found_inf=flag_on(found_inf, bucket.device),
                    implementation=self.implementation if bucket.dense else "reference",
                    workspace=self._workspace, **hyper,
                )
                if path != "reference":  # fused ops write through raw pointers, bypassing the counters
                    bump_versions(bucket.written)
                if bucket.odd_grads and bucket_scale is not None and store_unscaled:  # into .grad itself
                    foreach_copy(bucket.odd_grads, bucket.odd_grad_copies)
            if start is not None:
                start.settle(idle, bool(flat_runs or per_tensor), found_inf)
        return loss

    @staticmethod
    def _check_unscaled_grads_writable(bucket_maps: Iterable[Dict[Tuple, adam_state.Bucket]]) -> None:
        check_grads_writable((pair for buckets in bucket_maps for bucket in buckets.values()
                              if not bucket.grads_unscaled for pair in bucket.unlike_params), "FusedAdam")

    def _has_fused_path(self, device: torch.device) -> bool:
        """Whether params on ``device`` take a fused path (kernel or torch ops), which flat buffers need."""
        return resolve(self.implementation, device) != "reference"

    def _has_kernel(self, device: torch.device) -> bool:
        """Whether params on ``device`` take apexlite's kernels (which can read fresh grads where they are)."""
        return resolve(self.implementation, device) == "kernel"

    def _buckets(self, params: List[torch.Tensor], start: Optional[GroupStart] = None,
                 idle: Optional[List[torch.Tensor]] = None) -> Dict[Tuple, adam_state.Bucket]:
        """The per-tensor path's buckets for ``params`` (those not in flat buffers this step). Under the group
        step count, ``start`` gives new states their first counter and ``idle`` collects the counters of
        params without a grad."""
        buckets: Dict[Tuple, adam_state.Bucket] = {}
        for param in params:
            grad, unscaled = adam_state.step_grad(param, self.state.get(param))
            if grad is None:
                if idle is not None and "step" in self.state.get(param, ()):
                    idle.append(self.state[param]["step"])
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
            if start is not None:
                start.give_counter(param, state)
            adam_state.init_state(param, state, self.master_weights, self.exp_avg_dtype)
            adam_state.fit_state(param, state, self.exp_avg_dtype)
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
