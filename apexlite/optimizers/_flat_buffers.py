"""FusedAdam's flat buffers: each param group's params and state as views into a few contiguous
buffers, so that a step is one kernel call per buffer set whatever the number of tensors.

NOTE [flat buffers]
- Built at a group's first step from the params that have a grad then, in group order: one set of
  buffers per (device, dtypes, step count), each holding the weights the math updates (fp32 masters,
  or the params themselves), the fp16/bf16 params written from masters, ``exp_avg``, ``exp_avg_sq``
  and one step counter per param; at most MAX_BUFFER_ELEMENTS elements per buffer.
- Every tensor keeps its Python object: a param, a master, a moment or a step counter is re-pointed
  into its buffer (same shape, strides and values; _flat_memory.py), a param through ``.data`` so that
  its autograd node and the hooks on it (DDP's) stay, so ``model.parameters()`` holds
  the same Parameters, ``state_dict()`` keeps torch's format (one ``exp_avg``/``exp_avg_sq``/``step``
  per param) and memory holds one copy of each. Only plain Parameters that alone use their memory,
  dense, non-empty, of a supported dtype, on a device with a fused path, are flattened; the others
  (views, tensor subclasses such as DTensor or FSDP's flat params, strided slices, CPU params in shared
  memory) take the per-tensor path. The grads: NOTE [flat grads] in _flat_grads.py.
- Checked each step at no Python cost per param (apexlite._C.flat_grads): the group's params list, each
  param's memory, each grad; a large set on a GPU in pieces, each launched once checked (_flat_runs.py).
  The state is watched (_watched_state.py): replacing a member's entries, its state dict or the
  optimizer's ``state`` rebuilds the layout from the tensors then in place. A set steps from one count:
  a counter changed in place (``state[p]["step"].zero_()``) rebuilds it on the CPU (one min/max per set);
  on a GPU that check would wait for the device, so there such a change is not seen: assign instead.
  A param without grad, a grad of another dtype, a replaced ``.data`` (``model.half()``) or a changed
  params list send the step down the per-tensor path once and rebuild the layout at the next step,
  re-reading the step counters (one host sync). A group that still changes after MAX_REBUILDS
  rebuilds stays on the per-tensor path (said once at INFO). A grad no build could take (a master's
  own fp32 grad, O2 accumulating or clipping; one on another device) steps per tensor and rebuilds nothing.
- Costs: building copies a set's params and state into the new buffers while the old memory is
  still held (at most one buffer's worth, MAX_BUFFER_ELEMENTS, more at once per role). A tensor
  that aliased a param's old memory (``w = layer.weight.detach()`` taken before the first step) no
  longer follows the param; a param saved on its own (``torch.save(layer.weight)``) writes its whole
  buffer. ``FusedAdam(flat_buffers=False)`` keeps every tensor where it is.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.optimizers import _adam_state as adam_state
from apexlite.optimizers._flat_grads import (GROUP_CHANGED, NOT_IN_BUFFER, PARAMS_CHANGED, READ_IN_PLACE, READY,
                                             REASONS, REBUILD, fresh_grad_policy, flat_grads, flat_grads_in_place,
                                             flat_zero_grads)
from apexlite.optimizers._flat_memory import (OwnedBuffers, alias, chunks, flattenable, move_into, new_buffer, repoint,
                                              start_of, step_values)
from apexlite.optimizers._flat_runs import FlatRun, PiecePolicy, PiecewiseRun, WholeRun, call_over
from apexlite.optimizers._watched_state import Watch, WatchedState, WatchedStateMap

MAX_REBUILDS = 4
GiveCounter = Callable[[torch.Tensor, Dict[str, Any]], None]  # (param, its state): a first step counter
_log = get_logger("optimizers")


@dataclass
class FlatSet:
    """The buffers of one (device, dtypes, step count) set of params, and what each step checks."""

    members: Tuple[torch.Tensor, ...]  # the model params, in group order
    masters: Optional[Tuple[torch.Tensor, ...]]  # their fp32 masters, or None
    weights: torch.Tensor  # what the math updates: the masters' buffer, else the params'
    copies: Optional[torch.Tensor]  # the fp16/bf16 params written from the masters, or None
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    steps: torch.Tensor  # one counter per member, all equal
    param_spans: torch.Tensor  # int64 (members, 2): where each member's data must still be, and its numel
    offsets: torch.Tensor  # int64: where each member starts in the buffers
    starts: Tuple[int, ...]  # the same offsets, as Python ints
    grad_like: torch.Tensor  # empty, of the grads' dtype and device
    grad_start: int  # where the grad buffer starts in its storage, in elements
    watch: Watch = field(default_factory=Watch)
    piece_views: Dict[Tuple[int, int], Tuple[Optional[torch.Tensor], ...]] = field(default_factory=dict)  # _flat_runs
    cuts: Optional[Tuple[Any, Optional[List[int]]]] = None  # (policy, its piece ends), PiecePolicy.bounds_of
    had_fresh_grads: bool = False  # the last ready check found fresh grads (moved or read in place: NOTE [flat grads])
    fresh_policy: Optional[Tuple[Tuple[int, int], ...]] = None  # fresh_grad_policy's answers, by had_fresh_grads


@dataclass
class GroupLayout:
    known: Tuple[torch.Tensor, ...]  # the group's params when built
    options: Tuple[Any, ...]  # (master_weights, moment dtype) when built
    sets: List[FlatSet]
    outsiders: List[torch.Tensor]  # never flattened
    waiting: List[torch.Tensor]  # had no grad that fits a build: such a grad now rebuilds the layout
    stale: bool = False


class FlatBuffers:
    """Owns FusedAdam's flat buffers (NOTE [flat buffers]): builds, checks and rebuilds them, hands each
    step its flat calls and the params that take the per-tensor path. Reads the optimizer's ``state``,
    ``master_weights`` and ``exp_avg_dtype``, and replaces ``state`` by a watched map."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.piece_policy = PiecePolicy()
        self._layouts: Dict[int, Tuple[dict, GroupLayout]] = {}
        self._rebuilds: Dict[int, int] = {}
        self._watches: Dict[torch.Tensor, Watch] = {}
        self._state_map: Optional[WatchedStateMap] = None
        self._owned = OwnedBuffers()

    def invalidate(self) -> None:
        """Forget every layout (state loaded or replaced): the next step builds from the tensors then."""
        self._layouts.clear()

    def plan(self, optimizer: torch.optim.Optimizer, group: Dict[str, Any], has_fused_path: Callable[[torch.device], bool],
             has_kernel: Callable[[torch.device], bool], give_counter: Optional[GiveCounter] = None
             ) -> Tuple[List[FlatRun], List[torch.Tensor]]:
        """This step's flat runs for ``group`` (each yields its calls as it is iterated), and the params
        that take the per-tensor path (with the waiting params whose counter the group's count advances).
        ``has_kernel``: whether apexlite's kernels (which can read fresh grads where they are) step
        params on a device; ``give_counter``: how a param joining a build without state gets its counter."""
        params = group["params"]
        if not self.enabled or self._rebuilds.get(id(group), 0) > MAX_REBUILDS:
            return [], list(params)
        layout = self._layout(optimizer, group, has_fused_path, give_counter)
        runs: List[FlatRun] = []
        rest = list(layout.outsiders)
        for flat_set in layout.sets:
            if flat_set.fresh_policy is None:  # (neither its device nor the kernels change)
                device = flat_set.weights.device
                flat_set.fresh_policy = tuple(fresh_grad_policy(device, has_kernel(device), again) for again in (0, 1))
            fresh_limit, grad_reads = flat_set.fresh_policy[flat_set.had_fresh_grads]
            bounds = self.piece_policy.bounds_of(flat_set)
            if bounds is not None:
                stop, grad = flat_grads_in_place(params, layout.known, flat_set.members, flat_set.masters,
                                                 flat_set.param_spans, flat_set.offsets, flat_set.grad_like,
                                                 flat_set.weights.numel(), flat_set.grad_start, 0, bounds[0], None)
                if stop < 0:
                    self._rebuild_later(group, layout, GROUP_CHANGED)
                    return [], list(params)
                if stop > 0:
                    flat_set.had_fresh_grads = False  # (its first piece's grads were kept)
                    runs.append(PiecewiseRun(params, layout.known, flat_set, bounds, stop, grad, fresh_limit,
                                             lambda reason: self._rebuild_later(group, layout, reason)))
                    continue
            status, reason, grads = flat_grads(params, layout.known, flat_set.members, flat_set.masters,
                                               flat_set.param_spans, flat_set.offsets, flat_set.grad_like,
                                               flat_set.weights.numel(), flat_set.grad_start, fresh_limit, grad_reads)
            if status in (READY, READ_IN_PLACE):
                flat_set.had_fresh_grads = reason > 0  # (a ready answer's reason: how many grads were fresh)
                runs.append(WholeRun(call_over(flat_set, grads)))
                continue
            if status == REBUILD:
                self._rebuild_later(group, layout, reason)
            if reason == GROUP_CHANGED:
                return [], list(params)
            rest.extend(flat_set.members)
        rest.extend(self._waiting_now(group, layout))
        return runs, rest

    def _waiting_now(self, group: Dict[str, Any], layout: GroupLayout) -> List[torch.Tensor]:
        """The params without a place in the buffers that step per tensor now (those with a grad) or whose
        counter the group's step count advances (those with state); a grad that fits a build rebuilds the
        layout at the next step. A master's own fp32 grad (O2 accumulating or clipping) does not fit."""
        now, rebuild = [], False
        for param in layout.waiting:
            entry = self._state_map.get(param)
            grad, masters_own = adam_state.step_grad(param, entry)
            if grad is not None:
                rebuild = rebuild or _fits_a_build(param, grad, masters_own)
                now.append(param)
            elif entry and "step" in entry:
                now.append(param)
        if rebuild:
            self._rebuild_later(group, layout, 0)
        return now

    def clear_grads(self, group: Dict[str, Any], set_to_none: bool) -> List[torch.Tensor]:
        """zero_grad for the params of ``group`` in flat buffers (one pass per set, and one fill when the grads
        are kept); returns the params left to clear one by one. No Python work per flattened param."""
        entry = self._layouts.get(id(group))
        if not self.enabled or entry is None or entry[0] is not group or not entry[1].sets:
            return list(group["params"])
        layout = entry[1]
        rest = layout.outsiders + layout.waiting
        for flat_set in layout.sets:
            answer = flat_zero_grads(group["params"], layout.known, flat_set.members, flat_set.offsets,
                                     flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start, set_to_none)
            if answer == PARAMS_CHANGED:
                return list(group["params"])
            if answer == NOT_IN_BUFFER:
                rest.extend(flat_set.members)
        return rest

    def _rebuild_later(self, group: Dict[str, Any], layout: GroupLayout, reason: int) -> None:
        if layout.stale:
            return
        layout.stale = True
        count = self._rebuilds[id(group)] = self._rebuilds.get(id(group), 0) + 1
        why = REASONS[reason] or "a param without a grad at the last build has one now"
        if count > MAX_REBUILDS:
            _log.info("FusedAdam: a param group of %d params changed its flat buffers %d times (last: %s); it "
                      "keeps the per-tensor path from now on", len(group["params"]), count, why)
        else:
            _log.debug("FusedAdam: rebuilding the flat buffers of a param group at the next step: %s", why)

    def _layout(self, optimizer: torch.optim.Optimizer, group: Dict[str, Any],
                has_fused_path: Callable[[torch.device], bool], give_counter: Optional[GiveCounter]) -> GroupLayout:
        if optimizer.state is not self._state_map:  # a load or a reset replaced it
            self.invalidate()
            self._watches = {}
            self._state_map = optimizer.state = WatchedStateMap(optimizer.state, self._watches)
        options = (optimizer.master_weights, optimizer.exp_avg_dtype)
        entry = self._layouts.get(id(group))
        layout = entry[1] if entry is not None and entry[0] is group else None
        if layout is None or layout.stale or layout.options != options or _outdated(layout):
            if layout is not None:
                for member in (m for flat_set in layout.sets for m in flat_set.members):
                    self._watches.pop(member, None)
            layout = self._build(group, options, has_fused_path, give_counter)
            self._layouts[id(group)] = (group, layout)
        return layout

    def _build(self, group: Dict[str, Any], options: Tuple[Any, ...],
               has_fused_path: Callable[[torch.device], bool], give_counter: Optional[GiveCounter]) -> GroupLayout:
        master_weights, moment_dtype = options
        state = self._state_map
        self._owned.prune()
        outsiders, waiting, joining = [], [], []
        for param in group["params"]:
            if not flattenable(param, has_fused_path, self._owned):
                outsiders.append(param)
                continue
            grad, masters_own = adam_state.step_grad(param, state.get(param))
            if grad is None or not _fits_a_build(param, grad, masters_own):
                waiting.append(param)
                continue
            joining.append((param, grad.dtype))
        tied = _sharing_memory([param for param, _ in joining])
        if tied:  # (tied mid-run with `b.data = a.data`): a buffer would give each its own copy
            outsiders += [param for param, _ in joining if id(param) in tied]
            joining = [(param, dtype) for param, dtype in joining if id(param) not in tied]
        if give_counter is not None:
            for param, _ in joining:
                give_counter(param, state[param])
        steps = step_values([state.get(param, {}) for param, _ in joining])
        keyed: Dict[Tuple[Any, ...], List[torch.Tensor]] = {}
        for (param, grad_dtype), step in zip(joining, steps):
            entry = state[param]
            half = param.dtype in adam_state.HALF_DTYPES
            if "master_param" in entry and not half:  # not a state FusedAdam makes: as the per-tensor path has it
                outsiders.append(param)
                continue
            master = half and ("master_param" in entry or master_weights)
            moments = entry["exp_avg"].dtype if "exp_avg" in entry else moment_dtype
            key = (param.device, master, param.dtype, grad_dtype, moments, step)
            keyed.setdefault(key, []).append(param)
        sets = [self._make_set(chunk, *key) for key, params in keyed.items() for chunk in chunks(params)]
        return GroupLayout(tuple(group["params"]), options, sets, outsiders, waiting)

    def _make_set(self, params: List[torch.Tensor], device: torch.device, master: bool, param_dtype: torch.dtype,
                  grad_dtype: torch.dtype, moment_dtype: torch.dtype, step: float) -> FlatSet:
        state = self._state_map
        offsets = [0] + list(itertools.accumulate(p.numel() for p in params))
        total = offsets.pop()
        weights = new_buffer("weights", total, torch.float32 if master else param_dtype, device)
        copies = new_buffer("copies", total, param_dtype, device) if master else None
        exp_avg, exp_avg_sq = (new_buffer(role, total, moment_dtype, device) for role in ("exp_avg", "exp_avg_sq"))
        steps = torch.full((len(params),), step, dtype=torch.float32, device=device)
        targets, sources = [], []
        for param, offset in zip(params, offsets):
            entry = state[param]
            targets.append(alias(weights, offset, param))
            sources.append(entry.get("master_param", param))
            if copies is not None:
                targets.append(alias(copies, offset, param))
                sources.append(param)
            for key, buffer in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
                if key in entry:
                    targets.append(alias(buffer, offset, param))
                    sources.append(entry[key])
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)
            watch = Watch()
            for index, (param, offset) in enumerate(zip(params, offsets)):
                entry = WatchedState(state[param], watch)
                dict.__setitem__(state, param, entry)
                self._watches[param] = watch
                model = copies if copies is not None else weights
                repoint(param, alias(model, offset, param))
                if copies is not None:
                    move_into(entry, "master_param", weights, offset, param)
                move_into(entry, "exp_avg", exp_avg, offset, param)
                move_into(entry, "exp_avg_sq", exp_avg_sq, offset, param)
                move_into(entry, "step", steps, index, steps[index])
        self._owned.add(weights if copies is None else copies)
        masters = tuple(state[p]["master_param"] for p in params) if copies is not None else None
        return FlatSet(
            members=tuple(params), masters=masters, weights=weights, copies=copies, exp_avg=exp_avg,
            exp_avg_sq=exp_avg_sq, steps=steps, param_spans=torch.tensor([[p.data_ptr(), p.numel()] for p in params], dtype=torch.int64).reshape(-1, 2),
            offsets=torch.tensor(offsets, dtype=torch.int64), starts=tuple(offsets),
            grad_like=torch.empty(0, dtype=grad_dtype, device=device), grad_start=start_of("grad", grad_dtype),
            watch=watch)


def _outdated(layout: GroupLayout) -> bool:
    """Whether a member's state was replaced, a step counter on the CPU changed in place (its set steps from
    one count: NOTE [flat buffers]), or (before any set exists: a first step) a waiting param has a grad."""
    for flat_set in layout.sets:
        if flat_set.watch.dirty:
            return True
        steps = flat_set.steps
        if steps.device.type == "cpu" and len(steps) > 1:
            low, high = steps.aminmax()
            if bool(low != high):
                return True
    return not layout.sets and any(p.grad is not None for p in layout.waiting)


def _sharing_memory(params: List[torch.Tensor]) -> Set[int]:
    """The ids of the params whose memory overlaps another's: they keep stepping where they are, as torch steps
    them, instead of each getting a slot of its own."""
    spans = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size(), id(p)) for p in params)
    tied: Set[int] = set()
    reach, holder = -1, 0
    for start, stop, key in spans:
        if start < reach:
            tied.update((key, holder))
        if stop > reach:
            reach, holder = stop, key
    return tied


def _fits_a_build(param: torch.Tensor, grad: torch.Tensor, masters_own: bool) -> bool:
    """Whether ``grad`` can join the buffers: the param's own dense grad, on its device, of a supported dtype."""
    return (not masters_own and grad.layout == torch.strided and grad.device == param.device
            and grad.dtype in adam_state.SUPPORTED_DTYPES)
