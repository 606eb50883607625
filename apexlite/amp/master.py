"""MasterParams: O2's fp32 master weights, owned in one place.

NOTE [O2 grad ownership]
- The optimizer's param groups hold fp32 masters in place of the low-precision model params (same
  positions), so any torch optimizer steps fp32 values and keeps fp32 state. Params that are already
  fp32 (batchnorm under keep_batchnorm_fp32) stay in the groups and are their own masters.
- On leaving `scale_loss` the model's low-precision grads are converted, unscaled and checked into
  the masters' `.grad` (added to what earlier backward passes left there). The model params' own
  grads stay as backward produced them (scaled), as in apex: clip `amp.master_params(optimizer)`.
- After an applied step the masters are copied into the model params (which bumps their autograd
  version, invalidating cached casts); a skipped step drops every grad it would have used (a later
  backward adds to older grads without checking them again).
- Masters travel in `optimizer.state_dict()` under MASTERS_KEY and are restored by
  `load_state_dict`, so an O2 run resumes bit-identically (apex rebuilt them from fp16 weights).

NOTE [the masters are the truth]
- The copy into the model runs inside the optimizer's step, as its first step post-hook, so the
  user's post-hooks (global ones run after the optimizer's) see the updated model, and one that
  raises (a logging hook's bug, Ctrl-C) cannot leave the model a step behind its masters.
- A step that raises anywhere else (a pre-hook: nothing updated; the optimizer itself, part-way
  through its param groups) still ends with the model copied from whatever the masters hold; the
  master grads stay, so the step can be retried. See AmpOptimizer._settle_failed_step.
- The copy itself finishes tensor by tensor if the batched copy raises, and then re-raises.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.plain_grads import PlainGrads, optimizer_params
from apexlite.amp.checkpoint_convert import MASTERS_KEY, mark_masters, take_owned_masters, without_marker
from apexlite.amp.checks import sparse_grad_error
from apexlite.amp.errors import AmpUsageError
from apexlite.amp.grad_strategy import spread
from apexlite.amp.master_copies import (LOW_PRECISION, check_saved_masters, copy_into, keep_loaded_weights,
                                        o2_accumulation_note, stale_masters_note)
from apexlite.amp.master_sync import MasterSync, several_processes
from apexlite.master_rounding import holds_master
from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.optimizer_step import register_first_post_hook
from apexlite.amp.scaler import LossScaler
from apexlite.amp.model_loads import Loaded

log = get_logger("amp")


class MasterParams:
    """The fp32<->low-precision mapping for one optimizer, plus grad movement and sync."""

    def __init__(self, optimizer: Any, fp32_sources: Optional[Dict[torch.Tensor, torch.Tensor]] = None,
                 carried: bool = False) -> None:
        self.optimizer = optimizer
        self.model_params: List[torch.Tensor] = []
        self.masters: List[torch.Tensor] = []
        # fp32 copies of the params from before the cast; those of params without a master yet (frozen) are
        # kept until the first backward, apex's moment for making masters, then dropped (memory; see post)
        in_groups = {id(param) for group in optimizer.param_groups for param in group["params"]}
        self._fp32_sources = {param: source for param, source in (fp32_sources or {}).items()
                              if id(param) in in_groups}
        self.update_finished = False  # set by the step post-hook: this step's update is done
        self._model_follows = False  # ... and the model params hold the updated masters
        self._grad_sample: List[torch.Tensor] = []  # model_grad_sample: from the last post
        self.restored = 0  # masters taken from per-param state a checkpoint loaded before initialize carried
        self.stale = 0  # ... and such masters the loaded weights beside them do not hold (left out)
        for group in optimizer.param_groups:
            self._replace_in_group(group)
        if self.stale:
            log.warning(stale_masters_note(self.stale, self.stale + self.restored, type(optimizer).__name__))
        if self.restored:
            log.info("restored %d fp32 master weight(s) of %s from the optimizer state it loaded before "
                     "amp.initialize", self.restored, type(optimizer).__name__)
            self.copy_masters_to_model()
        self._fp32_grads = PlainGrads(optimizer, params_fn=self._fp32_params)
        self._posted = False  # a backward's grads reached the masters since the last step
        self._warned_ranks = False
        self.sync_from_model = MasterSync(self.master_pairs, type(optimizer).__name__, carried or self.restored > 0)

    # --- construction -------------------------------------------------------------------------
    def _make_master(self, param: torch.Tensor) -> torch.Tensor:
        source = self._fp32_sources.pop(param, None)
        data = source if source is not None else param.detach().float()
        state = self.optimizer.state.pop(param, None)
        carried = state.pop("master_param", None) if state else None
        if isinstance(carried, torch.Tensor) and carried.shape == param.shape:  # NOTE in checkpoint_convert.py
            if holds_master(data, carried):
                data = carried.detach().to(device=param.device, dtype=torch.float32)
                self.restored += 1
            else:  # the loaded weights are newer (master_rounding.py)
                self.stale += 1
        master = torch.nn.Parameter(data, requires_grad=True)
        if state:
            self.optimizer.state[master] = {
                k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() else v)
                for k, v in state.items()
            }
        return master

    def _replace_in_group(self, group: Dict[str, Any], wanted=lambda param: param.requires_grad) -> int:
        """Each low-precision param of `group` that `wanted` picks gets its fp32 master in its place."""
        made = 0
        params = group["params"]
        for index, param in enumerate(params):
            if param.dtype in LOW_PRECISION and wanted(param):
                master = self._make_master(param)
                params[index] = master
                self.model_params.append(param)
                self.masters.append(master)
                made += 1
        return made

    def _adopt_unfrozen(self) -> None:
        """A low-precision param still in the groups has a grad now: frozen (requires_grad=False) at initialize
        and unfrozen since. It gets its master here, as apex made masters at the first scale_loss; stepped in
        fp16 by the optimizer itself it would overflow (Adam's eps) or lose its updates."""
        made = sum(self._replace_in_group(group, lambda param: param.grad is not None)
                   for group in self.optimizer.param_groups)
        if made:
            log.info("amp O2: %d low-precision param(s) of %s without an fp32 master (requires_grad=False at "
                     "amp.initialize) have grads now; their masters are made from their current weights",
                     made, type(self.optimizer).__name__)

    def _fp32_params(self) -> List[torch.Tensor]:
        masters = {id(m) for m in self.masters}
        return [p for p in optimizer_params(self.optimizer) if id(p) not in masters]

    # --- strategy interface used by AmpOptimizer ------------------------------------------------
    def prepare(self, scale: float = 1.0) -> None:
        """Before a backward with loss scale `scale`: the model's grads of earlier micro-batches are on the masters
        already (summed in fp32); across ranks that can hide micro-batches DDP never reduced (warned once)."""
        self.sync_from_model()
        if not self._warned_ranks and self._posted and several_processes() and any(
                param.grad is not None for param in self.model_params):
            self._warned_ranks = True
            log.warning(o2_accumulation_note(type(self.optimizer).__name__))
        for param in self.model_params:
            param.grad = None
        self._fp32_grads.prepare(scale)

    def post(self, scaler: LossScaler) -> None:
        self._posted = True
        self._adopt_unfrozen()
        self._fp32_sources = {}  # a param unfrozen from now on starts from its half weights, as in apex
        pairs = [(m, p.grad) for p, m in zip(self.model_params, self.masters) if p.grad is not None]
        if any(grad.is_sparse for _, grad in pairs):
            raise sparse_grad_error()
        self._grad_sample = [grad for _, grad in spread(pairs)]
        if pairs:
            fresh = [grad.to(torch.float32, copy=True) for _, grad in pairs]
            if scaler.checks_overflow:
                scaler.unscale(fresh)
            accumulate = [(g, m.grad) for g, (m, _) in zip(fresh, pairs) if m.grad is not None]
            if accumulate:
                torch._foreach_add_([a for a, _ in accumulate], [b for _, b in accumulate])
            for grad, (master, _) in zip(fresh, pairs):
                master.grad = grad
        self._fp32_grads.post(scaler)

    def new_grads(self) -> List[torch.Tensor]:
        return [p.grad for p in self.model_params if p.grad is not None] + self._fp32_grads.new_grads()

    def discard_new(self) -> None:
        for param in self.model_params:
            param.grad = None
        self._fp32_grads.discard_new()

    def master_pairs(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """(model param, fp32 master) for every low-precision param the optimizer trains."""
        return list(zip(self.model_params, self.masters))

    def model_grad_sample(self) -> List[torch.Tensor]:
        return self._grad_sample

    def lazy_init(self) -> None:
        """The masters take the model's weights where they changed since initialize (MasterSync's first use)."""
        self.sync_from_model()

    def weights_loaded(self, loaded: Loaded) -> None:
        self.sync_from_model.rearm(loaded)

    def before_step(self) -> None:
        self.sync_from_model()
        if not any(master.grad is not None for master in self.masters) and any(
                param.grad is not None for param in self.model_params):
            raise AmpUsageError(
                "optimizer.step() found grads on the model's low-precision params but none on the fp32 master "
                "params the optimizer updates (O2): the backward ran outside amp.scale_loss, so this step would "
                "change nothing. Run it as `with amp.scale_loss(loss, optimizer) as scaled_loss: "
                "scaled_loss.backward()`.")
        self.update_finished = False
        self._model_follows = False

    def after_update(self, optimizer: Any = None, args: Any = None, kwargs: Any = None) -> None:
        """Step post-hook, the optimizer's first: the model follows the masters before any later hook runs."""
        self.update_finished = True
        self.copy_masters_to_model()
        self._model_follows = True

    def after_step(self) -> None:
        if not self._model_follows:  # an optimizer without step hooks, or a hook that raised part-way
            self.copy_masters_to_model()
        self._model_follows = False
        self._posted = False
        for master in self.masters:
            master.grad = None

    def abandon_step(self) -> None:
        """The step raised before its update finished: the model follows whatever the masters hold
        (all, some or none of them updated); their grads stay for a retry."""
        self.copy_masters_to_model()

    def on_skip(self) -> None:
        """Drop the overflowed grads (masters', model params', fp32 params') with the step."""
        self._posted = False
        for master, param in zip(self.masters, self.model_params):
            master.grad = None
            param.grad = None
        self._fp32_grads.on_skip()

    def copy_masters_to_model(self) -> None:
        copy_into(self.model_params, self.masters)

    # --- optimizer methods patched for O2 -------------------------------------------------------
    def install(self, patcher: Patcher) -> None:
        optimizer = self.optimizer
        self._zero_grad = patcher.set_attribute(optimizer, "zero_grad", self.zero_grad)
        self._add_param_group = patcher.set_attribute(optimizer, "add_param_group", self.add_param_group)
        self._state_dict = patcher.set_attribute(optimizer, "state_dict", self.state_dict)
        self._load_state_dict = patcher.set_attribute(optimizer, "load_state_dict", self.load_state_dict)
        handle = register_first_post_hook(optimizer, self.after_update)
        if handle is not None:
            patcher.add_handle(handle, f"{type(optimizer).__name__} step post-hook (model follows masters)",
                               owner=optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear master grads and the model params' grads (apex cleared only the masters' view)."""
        self.sync_from_model()
        self._zero_grad(set_to_none=set_to_none)
        for param in self.model_params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_()
                param.grad.zero_()

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param group must be a dict, got {type(param_group).__name__}")
        self.sync_from_model()
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters must be an ordered collection (a list), not a set.")
        group = dict(param_group, params=list(params))
        present = {id(p) for p in optimizer_params(self.optimizer)} | {id(p) for p in self.model_params}
        if len({id(p) for p in group["params"]}) != len(group["params"]) or any(
                id(p) in present for p in group["params"]):
            raise ValueError(
                "some parameters appear in more than one parameter group (a param given to add_param_group "
                "is already in this optimizer, or twice in the new group); under O2 each copy would get its "
                "own fp32 master and be trained twice."
            )
        self._replace_in_group(group)
        self._add_param_group(group)

    def state_dict(self) -> Dict[str, Any]:
        self.sync_from_model()
        state = self._state_dict()
        copies = {id(master): master.detach().clone() for master in self.masters}
        state[MASTERS_KEY] = [copies[id(master)] for master in self.masters]
        mark_masters(state, [[copies[id(p)] for p in group["params"] if id(p) in copies]
                             for group in self.optimizer.param_groups])
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Validate the whole checkpoint first, then load: a rejected one leaves live state untouched."""
        state_dict = without_marker(state_dict)
        saved = state_dict.pop(MASTERS_KEY, None)
        if saved is None:
            saved = take_owned_masters(state_dict, optimizer_params(self.optimizer), self.masters)
        if saved is not None:
            check_saved_masters(saved, self.masters)
        written = self.sync_from_model.written(self.model_params, self.masters)
        self._load_state_dict(state_dict)
        self.sync_from_model.settle()  # the masters come from the checkpoint or, below, the model
        if saved is None:
            # A checkpoint without masters (e.g. written by apex): rebuild them from the model weights.
            with torch.no_grad():
                torch._foreach_copy_(self.masters, [p.float() for p in self.model_params])
            return
        with torch.no_grad():
            torch._foreach_copy_(self.masters, [t.to(m.device) for t, m in zip(saved, self.masters)])
        rebuilt = keep_loaded_weights(self.model_params, self.masters, written)
        if rebuilt:
            log.warning(stale_masters_note(rebuilt, len(self.masters), type(self.optimizer).__name__))
        self.copy_masters_to_model()

    def detach(self) -> None:
        """Session teardown: put the model params back into the param groups, state with them."""
        back = {id(m): p for p, m in zip(self.model_params, self.masters)}
        for group in self.optimizer.param_groups:
            for index, param in enumerate(group["params"]):
                model_param = back.get(id(param))
                if model_param is None:
                    continue
                group["params"][index] = model_param
                state = self.optimizer.state.pop(param, None)
                if state:
                    self.optimizer.state[model_param] = state
        self._fp32_grads.detach()
