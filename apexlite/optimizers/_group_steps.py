"""FusedAdam's two ways to count steps: apex's (``step_count="group"``) and torch's (``"param"``).

Each param keeps its own counter in ``state[p]["step"]`` (torch's format) under both rules. torch advances a
counter only when its param steps. apex kept one count per param group and advanced it on every ``step()``,
so a param that gets a grad on some steps only (a conditional branch, an MoE expert, a layer unfrozen
later) was bias-corrected with the group's count. The group rule gives the same numbers from per-param
counters:
- a param with a counter but no grad this step has its counter advanced too (not on a step that
  ``found_inf`` skips);
- a param's first counter starts from the group's count: its largest counter, or, while no param of the
  group has one, the steps the group took so far, kept in ``group["step"]`` (apex's key) until then;
- ``state_dict()`` saves the group's count as ``group["step"]``, as apex did.
When every param has a grad on every step the two rules agree bit for bit.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from apexlite.optimizers._adam_step import flag_on
from apexlite.optimizers._flat_memory import step_values

STEP_COUNTS = ("group", "param")
Count = Union[float, torch.Tensor]


def check_step_count(step_count: Any) -> str:
    """``step_count`` itself, refused with what to pass when it is not one of STEP_COUNTS."""
    if step_count not in STEP_COUNTS:
        raise ValueError(f"step_count must be 'group' (apex: every step() advances the count of all a group's "
                         f"params) or 'param' (torch.optim.Adam: only params with a grad), got {step_count!r}")
    return step_count


def group_count(group: Dict[str, Any], state: Dict[torch.Tensor, Dict[str, Any]]) -> float:
    """The steps ``group`` has taken: its largest counter, else the count it keeps while it has none (one
    read from each device)."""
    counters = [state[p] for p in group["params"] if "step" in state.get(p, ())]
    if counters:
        return max(step_values(counters))
    return float(group.get("step", 0))


def save_group_count(saved: Dict[str, Any], live: Dict[str, Any], state: Dict[torch.Tensor, Dict[str, Any]]) -> None:
    """Writes a group-rule group's count into its checkpointed copy as apex's ``group["step"]`` (apex's
    FusedAdam resumes from it)."""
    if live["step_count"] == "group":
        saved["step"] = int(group_count(live, state))


def load_group_count(group: Dict[str, Any], state: Dict[torch.Tensor, Dict[str, Any]]) -> None:
    """Moves a loaded group's ``step`` (apex's per-group count, or apexlite's) into the state of its params
    that have no counter; a group-rule group none of whose params has state keeps it to start from."""
    group_step = group.pop("step", None)
    if group_step is None:
        return
    stateful = [param for param in group["params"] if state.get(param)]
    for param in stateful:
        if "step" not in state[param]:
            state[param]["step"] = torch.tensor(float(group_step), device=param.device)
    if group_step and group["step_count"] == "group" and not stateful:
        group["step"] = group_step


class ParamGroup(dict):
    """A FusedAdam param group whose ``group["step"]`` reads the group's step count (an int, as apex kept it
    there), though the count lives in the params' counters: the most steps any of its params took, or the
    steps the group took while none has a counter. ``"step" in group`` and ``group.get("step")`` still see
    only a stored key. It reads the optimizer's current ``state``, which the flat buffers replace. A copy or
    pickle of it is a plain dict (never a copy of the optimizer); the optimizer's own copies wrap theirs again."""

    def __init__(self, group: Dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        super().__init__(group)
        self._optimizer = optimizer

    def __reduce__(self) -> Tuple[type, Tuple[Dict[str, Any]]]:
        return dict, (dict(self),)

    def __missing__(self, key: str) -> int:
        if key != "step":
            raise KeyError(key)
        return int(group_count(self, self._optimizer.state))


class GroupStart:
    """The count a param starting its state in one step() takes under the group rule (read once, lazily)."""

    def __init__(self, group: Dict[str, Any], state: Dict[torch.Tensor, Dict[str, Any]]) -> None:
        self.group = group
        self.state = state
        self._count: Optional[float] = None

    def give_counter(self, param: torch.Tensor, entry: Dict[str, Any]) -> None:
        """Gives ``param``'s state the group's count when it has no counter yet."""
        if "step" in entry:
            return
        if self._count is None:
            self._count = group_count(self.group, self.state)
        entry["step"] = torch.tensor(self._count, dtype=torch.float32, device=param.device)

    def settle(self, idle: Sequence[torch.Tensor], stepped: bool, found_inf: Optional[Count]) -> None:
        """After the step: advance the idle counters; count a step in which no param has a counter in
        ``group["step"]``, and drop that key once counters carry the count."""
        advance(idle, found_inf)
        if self._count is not None:  # counters were started from the count: they carry it now
            self.group.pop("step", None)
        elif not stepped and not idle:
            self.group["step"] = self.group.get("step", 0) + _one_unless_skipped(found_inf, None)


def advance(counters: Sequence[torch.Tensor], found_inf: Optional[Count]) -> None:
    """Adds one to each counter, or nothing where ``found_inf`` says the step was skipped (no host sync)."""
    by_device: Dict[torch.device, List[torch.Tensor]] = {}
    for counter in counters:
        by_device.setdefault(counter.device, []).append(counter)
    for device, same_device in by_device.items():
        torch._foreach_add_(same_device, _one_unless_skipped(found_inf, device))


def _one_unless_skipped(found_inf: Optional[Count], device: Optional[torch.device]) -> Count:
    if found_inf is None:
        return 1.0
    flag = flag_on(found_inf, device or torch.as_tensor(found_inf).device)
    return (1.0 - flag).reshape(())
