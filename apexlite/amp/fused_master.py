"""FusedMasterGrads: O2 with an optimizer that keeps fp32 masters itself and unscales in its kernel.

NOTE [fused O2 step]
- Chosen for optimizers whose ``amp_fused_master_step`` is True (apexlite's FusedAdam; set it to
  False on the instance before ``amp.initialize`` to keep separate fp32 master params instead).
  The param groups keep the model's fp16/bf16 params; the optimizer holds one fp32 master per
  param in its state (``enable_master_weights``, seeded from the fp32 weights saved before the cast).
- Fast mode (one backward per step, no clipping): leaving ``scale_loss`` every half grad stays in
  ``.grad``, still scaled (fp16 keeps its small values), and is only checked for inf/NaN. ``step()``
  hands the optimizer ``grad_scale``, so one kernel pass unscales in registers, updates master and
  moments and writes the half copy: no fp32 grad copies, no unscale pass, no master->model copy.
  fp32 params (batchnorm under keep_batchnorm_fp32) are their own masters: their grads are unscaled
  in place on leaving ``scale_loss``, as apex did (a script may edit them before the step), and the
  optimizer is told so (``amp_fp32_grads_unscaled``).
- fp32 mode, entered when a second backward adds to existing grads or when
  ``amp.master_params(optimizer)`` is read (clipping; from then on every backward enters it, so a list
  of the master params kept across steps always holds this step's grads): unscaled fp32 grads live on the masters
  (``master.grad``, which the optimizer prefers over the param's) and on the fp32 params, exactly as
  in the separate-masters path, so accumulation happens in fp32 and clipping sees real values.
- The step, a skipped step and ``zero_grad`` return to fast mode; a skipped step also drops every
  grad it would have used.
- A step that raises before its update finished (a pre-hook, the optimizer part-way through its
  groups) removes its inputs, copies every master into its half param (NOTE [the masters are the
  truth] in master.py) and keeps the grads, scaled or fp32, exactly as they were, so a retried
  step computes what the first would have; one whose update finished (a later post-hook raised)
  is done as any other.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.plain_grads import PlainGrads, optimizer_params
from apexlite.amp.checks import sparse_grad_error
from apexlite.amp.errors import AmpUsageError
from apexlite.amp.grad_strategy import spread
from apexlite.amp.checkpoint_convert import MASTERS_KEY, without_marker
from apexlite.amp.master_copies import (LOW_PRECISION, check_saved_masters, copy_into, keep_loaded_weights,
                                        o2_accumulation_note, stale_masters_note)
from apexlite.master_rounding import holds_master
from apexlite.amp.master_sync import MasterSync, several_processes
from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.optimizer_step import register_first_post_hook
from apexlite.amp.scaler import LossScaler
from apexlite.amp.model_loads import Loaded

log = get_logger("amp")


_ABSENT = object()


def supports_fused_master_step(optimizer: Any) -> bool:
    """True when the optimizer can own fp32 masters and unscale half grads inside its step."""
    return bool(getattr(optimizer, "amp_fused_master_step", False)) and hasattr(
        optimizer, "enable_master_weights")


class FusedMasterGrads:
    """O2 grad handling for a fused optimizer: see NOTE [fused O2 step]."""

    def __init__(self, optimizer: Any, fp32_sources: Optional[Dict[torch.Tensor, torch.Tensor]] = None,
                 carried: bool = False) -> None:
        self.optimizer = optimizer
        half_ids = {id(p) for p in self._half_params()}
        seeds = {p: s for p, s in (fp32_sources or {}).items() if id(p) in half_ids}
        self._drop_stale_masters(seeds)
        optimizer.enable_master_weights(seeds)
        self._fp32_grads = PlainGrads(optimizer, params_fn=self._fp32_params)
        self._grads_scale = 1.0  # fast mode: the loss scale every current grad carries
        self._fp32_mode = False
        self._masters_read = False  # amp.master_params was read: every backward enters fp32 mode
        self._warned_ranks = False
        self._posted = False  # a scale_loss block ended since the last step or zero_grad
        self._stash: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._grad_sample: List[torch.Tensor] = []  # model_grad_sample: from the last post
        self._set_grad_scale = False
        self._own_leave_flag: Any = _ABSENT
        self.update_finished = False  # set by the step post-hook: this step's update is done
        self.sync_from_model = MasterSync(self.master_pairs, type(optimizer).__name__, carried)  # master_sync.py

    def _drop_stale_masters(self, seeds: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Masters in per-param state (an optimizer checkpoint loaded before initialize) that the model weights
        loaded beside them do not hold were left behind by a run without amp: the weights win (warned)."""
        stale = [param for param, seed in seeds.items() if "master_param" in self.optimizer.state.get(param, {})
                 and not holds_master(seed, self.optimizer.state[param]["master_param"])]
        for param in stale:
            del self.optimizer.state[param]["master_param"]
        if stale:
            log.warning(stale_masters_note(len(stale), len(seeds), type(self.optimizer).__name__))

    def _half_params(self) -> List[torch.Tensor]:
        return [p for p in optimizer_params(self.optimizer) if p.dtype in LOW_PRECISION]

    def _fp32_params(self) -> List[torch.Tensor]:
        return [p for p in optimizer_params(self.optimizer) if p.dtype not in LOW_PRECISION]

    def _master(self, param: torch.Tensor) -> torch.Tensor:
        """The fp32 tensor the optimizer updates for `param` (itself for an fp32 param)."""
        if param.dtype not in LOW_PRECISION:
            return param
        state = self.optimizer.state[param]
        if "master_param" not in state:  # a half param added after initialize, or an apex checkpoint
            state["master_param"] = torch.empty_like(param, dtype=torch.float32).copy_(param.detach())
        return state["master_param"]

    def master_pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(model param, fp32 master) for every half param of the optimizer."""
        return [(p, self._master(p)) for p in self._half_params()]

    def model_grad_sample(self) -> List[torch.Tensor]:
        return self._grad_sample

    # --- strategy interface used by AmpOptimizer ------------------------------------------------
    def prepare(self, scale: float = 1.0) -> None:
        self.sync_from_model()
        if not self._warned_ranks and self._posted and several_processes() and any(
                param.grad is not None for param in self._half_params()):
            self._warned_ranks = True
            log.warning(o2_accumulation_note(type(self.optimizer).__name__))
        if self._fp32_mode:
            for param in self._half_params():  # their sums so far live on the masters
                param.grad = None
            self._fp32_grads.prepare(scale)
            return
        self._stash = []
        for param in optimizer_params(self.optimizer):
            if param.grad is not None:
                self._stash.append((param, param.grad))
                param.grad = None

    def post(self, scaler: LossScaler) -> None:
        self._posted = True
        fresh = [grad for grad in (p.grad for p in optimizer_params(self.optimizer)) if grad is not None]
        if any(grad.is_sparse for grad in fresh):
            raise sparse_grad_error()
        if not self._fp32_mode and not self._stash and not self._masters_read:
            self._grads_scale = scaler.loss_scale() if scaler.checks_overflow else 1.0
            halves = [grad for grad in fresh if grad.dtype in LOW_PRECISION]
            singles = [grad for grad in fresh if grad.dtype not in LOW_PRECISION]
            if scaler.checks_overflow:
                if halves:
                    scaler.check(halves)
                if singles:  # fp32 params are their own masters: unscaled now, as apex left them
                    scaler.unscale(singles)
            self._grad_sample = spread(halves)
            return
        if not self._fp32_mode:
            self._fp32_grads.adopt_stash(self._enter_fp32_mode(self._stash))
            self._stash = []
        halves = [p for p in self._half_params() if p.grad is not None]
        self._grad_sample = [p.grad for p in spread(halves)]
        fresh = [p.grad.to(torch.float32, copy=True) for p in halves]
        if fresh and scaler.checks_overflow:
            scaler.unscale(fresh)
        for param, grad in zip(halves, fresh):
            master = self._master(param)
            if master.grad is None:
                master.grad = grad
            else:
                master.grad.add_(grad)
        self._fp32_grads.post(scaler)

    def _enter_fp32_mode(self, scaled: List[Tuple[torch.Tensor, torch.Tensor]]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Unscale fast-mode grads: half ones onto their masters (fp32 copies); fp32 ones fast mode left
        unscaled already.

        Returns the (fp32 param, unscaled grad) pairs.
        """
        inv_scale = 1.0 / self._grads_scale
        fp32_pairs = []
        for param, grad in scaled:
            target = self._master(param)
            if target is param:
                fp32_pairs.append((param, grad))
            else:
                target.grad = grad.float().mul_(inv_scale)
        self._fp32_mode = True
        return fp32_pairs

    def new_grads(self) -> List[torch.Tensor]:
        if self._fp32_mode:
            return [p.grad for p in self._half_params() if p.grad is not None] + self._fp32_grads.new_grads()
        return [p.grad for p in optimizer_params(self.optimizer) if p.grad is not None]

    def discard_new(self) -> None:
        if self._fp32_mode:  # the sums so far live on the masters and in the fp32 stash
            for param in self._half_params():
                param.grad = None
            self._fp32_grads.discard_new()
            return
        for param in optimizer_params(self.optimizer):
            param.grad = None
        for param, grad in self._stash:
            param.grad = grad
        self._stash = []

    def lazy_init(self) -> None:
        """The masters take the model's weights where they changed since initialize (MasterSync's first use)."""
        self.sync_from_model()

    def weights_loaded(self, loaded: Loaded) -> None:
        self.sync_from_model.rearm(loaded)

    def before_step(self) -> None:
        self.sync_from_model()
        if not self._posted and any(param.grad is not None for param in self._half_params()):
            raise AmpUsageError(
                "optimizer.step() found grads on the model's low-precision params, but no amp.scale_loss block "
                "made them since the last step (O2): a backward outside scale_loss carries no loss scale, which the "
                "step would still divide out. Run it as `with amp.scale_loss(loss, optimizer) as scaled_loss: "
                "scaled_loss.backward()`.")
        self.update_finished = False
        if not self._fp32_mode and self._grads_scale != 1.0:
            self.optimizer.grad_scale = self._grads_scale
            # the model's half grads stay scaled, as apex left them: no extra write pass in the kernel
            self._own_leave_flag = vars(self.optimizer).get("leave_grads_scaled", _ABSENT)
            self.optimizer.leave_grads_scaled = True
            self.optimizer.amp_fp32_grads_unscaled = True  # (post unscaled them)
            self._set_grad_scale = True

    def after_update(self, optimizer: Any = None, args: Any = None, kwargs: Any = None) -> None:
        """Step post-hook, the optimizer's first: the update (masters and half copies) is done."""
        self.update_finished = True

    def after_step(self) -> None:
        self.finish_step()

    def abandon_step(self) -> None:
        """The step raised before its update finished: see NOTE [fused O2 step]."""
        self._remove_step_inputs()
        pairs = self.master_pairs()
        copy_into([p for p, _ in pairs], [m for _, m in pairs])

    def finish_step(self) -> None:
        """Remove the step's inputs and return to fast mode (the step ran or was skipped; teardown)."""
        self._posted = False
        self._remove_step_inputs()
        self._leave_fp32_mode()

    def _remove_step_inputs(self) -> None:
        if self._set_grad_scale:
            del self.optimizer.grad_scale
            del self.optimizer.amp_fp32_grads_unscaled
            if self._own_leave_flag is _ABSENT:
                del self.optimizer.leave_grads_scaled
            else:
                self.optimizer.leave_grads_scaled = self._own_leave_flag
            self._set_grad_scale = False

    def on_skip(self) -> None:
        """Drop the overflowed grads with the step (a later backward would add to them unchecked)."""
        self.finish_step()
        for param in optimizer_params(self.optimizer):
            param.grad = None

    # --- unscaled fp32 grads for clipping ----------------------------------------------------------
    def master_params(self) -> Iterator[torch.Tensor]:
        """What the optimizer updates (fp32 masters and fp32 params), with unscaled fp32 grads."""
        self._masters_read = True
        if not self._fp32_mode:
            self._enter_fp32_mode([(p, p.grad) for p in optimizer_params(self.optimizer) if p.grad is not None])
        for param in optimizer_params(self.optimizer):
            yield self._master(param)

    def _leave_fp32_mode(self) -> None:
        if self._fp32_mode:
            for _, master in self.master_pairs():
                master.grad = None
            self._fp32_mode = False

    # --- optimizer methods patched ----------------------------------------------------------------
    def install(self, patcher: Patcher) -> None:
        self._zero_grad = patcher.set_attribute(self.optimizer, "zero_grad", self.zero_grad)
        self._load_state_dict = patcher.set_attribute(self.optimizer, "load_state_dict", self.load_state_dict)
        handle = register_first_post_hook(self.optimizer, self.after_update)
        if handle is not None:
            patcher.add_handle(handle, f"{type(self.optimizer).__name__} step post-hook (update finished)",
                               owner=self.optimizer)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """The optimizer's own zero_grad, which also drops the masters' fp32 grads."""
        self.sync_from_model()
        self._leave_fp32_mode()
        self._posted = False
        if set_to_none is None:
            self._zero_grad()
        else:
            self._zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Also accepts checkpoints written by the separate-masters O2 path (masters under MASTERS_KEY)."""
        state_dict = without_marker(state_dict)
        saved = state_dict.pop(MASTERS_KEY, None)
        halves = self._half_params()
        if saved is not None:  # before anything is loaded (FusedAdam checks its per-param state itself)
            check_saved_masters(saved, halves)
        written = self.sync_from_model.written(halves, [self._master(param) for param in halves])
        self._load_state_dict(state_dict)
        self.sync_from_model.settle()  # the masters come from the checkpoint (or FusedAdam's own state)
        if saved is not None:
            with torch.no_grad():
                for param, master in zip(halves, saved):
                    self._master(param).copy_(master)
        masters = [self._master(param) for param in halves]
        rebuilt = keep_loaded_weights(halves, masters, written)
        if rebuilt:
            log.warning(stale_masters_note(rebuilt, len(halves), type(self.optimizer).__name__))
        copy_into(halves, masters)

    def detach(self) -> None:
        """Session teardown: the optimizer keeps its fp32 masters (the model stays in half precision)."""
        self.finish_step()
        self._stash = []
        self._fp32_grads.detach()
