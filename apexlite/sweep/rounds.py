"""Timing every combination round by round: the runs start one after another and each pauses after its
warm-up; then they take turns at slices of steps until every speed ratio is precise enough or the time
budget is spent.

Rounds alternate their order (forward, backward, ...), so no combination always runs right after the same
one. A slice lasts about SLICE_S (at least one timed step, after one untimed step that wakes the run's
threads and caches again after its pause); with --max-steps the slices are cut so the runs
still have steps left for TARGET_ROUNDS rounds. A round's time for a run is the median of its slice's
steps that did not wait for a CPU (a slice where fewer than a quarter did is no measurement). After the
rounds each run goes on to its end, one at a time, so its final loss and memory are those of the whole run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from itertools import combinations
from typing import Callable, Dict, List, Optional, Tuple

from apexlite.sweep.children import PacedChild, Slice
from apexlite.sweep.intervals import MIN_ROUNDS, speed_ratio

Pair = Tuple[str, str]
SLICE_S = 0.1  # a slice's target length: long enough to hold several short steps, short enough for many rounds
MAX_SLICE_STEPS = 200
TARGET_ROUNDS = 12  # with --max-steps, slices are kept short enough for this many rounds
MAX_ROUNDS = 400
REWARM_STEPS = 1  # the gate runs this many untimed steps after every pause (apexlite.sweep.gate)
WAIT_SHARE = 0.05  # a step whose threads waited for a CPU longer than this share of its time is left out
CALM_SHARE_NEEDED = 4  # a slice counts when at least 1 in this many of its steps did not wait


@dataclass
class RoundTimes:
    """Per combination: each round's step time (median of its slice's undisturbed steps; None when the
    slice was mostly disturbed or not run), and how many timed steps there were and were disturbed."""

    wall: Dict[Pair, List[Optional[float]]] = field(default_factory=dict)
    steps: Dict[Pair, int] = field(default_factory=dict)
    disturbed: Dict[Pair, int] = field(default_factory=dict)
    waits_visible: bool = True  # False where the platform does not say how long threads waited for a CPU
    rounds: int = 0
    stopped: str = ""  # why the rounds ended

    @classmethod
    def empty(cls, pairs: List[Pair]) -> "RoundTimes":
        return cls({pair: [] for pair in pairs}, dict.fromkeys(pairs, 0), dict.fromkeys(pairs, 0))

    def extend(self, other: "RoundTimes") -> None:
        """Append another repeat's rounds (same combinations) after these."""
        for pair in self.wall:
            self.wall[pair] += other.wall[pair]
            self.steps[pair] += other.steps[pair]
            self.disturbed[pair] += other.disturbed[pair]
        self.waits_visible = self.waits_visible and other.waits_visible
        self.rounds += other.rounds
        self.stopped = other.stopped

    def add(self, pair: Pair, measured: Optional[Slice]) -> None:
        """Record one round's slice of `pair` (None: it had none)."""
        if measured is None or not measured.wall:
            self.wall[pair].append(None)
            return
        self.waits_visible = self.waits_visible and all(wait is not None for wait in measured.waited)
        calm = [wall for wall, wait in zip(measured.wall, measured.waited) if wait is None or wait <= WAIT_SHARE * wall]
        self.steps[pair] += len(measured.wall)
        self.disturbed[pair] += len(measured.wall) - len(calm)
        usable = calm and len(calm) * CALM_SHARE_NEEDED >= len(measured.wall)
        self.wall[pair].append(statistics.median(calm) if usable else None)


@dataclass
class RoundsOptions:
    """What every run of one sweep shares: the script, its limits, and when the rounds stop."""

    script: str
    script_args: List[str]
    timeout: float
    max_steps: Optional[int]
    warmup: int
    budget_s: float
    precision: float


def _slice_steps(times: List[Optional[float]], steps_left: Optional[int], rounds_done: int) -> int:
    """Timed steps for the next slice: about SLICE_S of stepping, within what --max-steps leaves (each slice
    also spends REWARM_STEPS untimed)."""
    recent = [value for value in times[-3:] if value]
    steps = max(1, min(MAX_SLICE_STEPS, int(SLICE_S / statistics.median(recent)))) if recent else 1
    if steps_left is not None:
        steps = max(1, min(steps, steps_left // max(TARGET_ROUNDS - rounds_done, 1) - REWARM_STEPS))
    return steps


def _precise(times: RoundTimes, pairs: List[Pair], precision: float) -> bool:
    return all(speed_ratio(times.wall[a], times.wall[b]).precise_to(precision) for a, b in combinations(pairs, 2))


def time_in_rounds(pairs: List[Pair], options: RoundsOptions,
                   progress: Callable[[str], None]) -> Tuple[Dict[Pair, dict], RoundTimes]:
    """Run every combination, timed in rounds; returns each one's record and the per-round step times."""
    children: Dict[Pair, PacedChild] = {}
    times = RoundTimes.empty(pairs)
    try:
        for pair in pairs:  # one start-up at a time: start-ups competing would eat each other's time limit
            child = children[pair] = PacedChild(options.script, options.script_args, pair[0], pair[1],
                                                options.timeout, options.max_steps, options.warmup)
            warm = child.wait_until_warm()
            progress(f"{pair[0]} {pair[1]}: " + ("warmed up" if warm else f"ended before its warm-up was over "
                                                                            f"({child.status})"))
        _run_rounds(children, times, options, progress)
        for pair, child in children.items():
            child.release()
            progress(f"{pair[0]} {pair[1]}: {child.status} ({child.running_s:.1f}s running)"
                     + (f": {child.error}" if child.error else ""))
        return {pair: child.record() for pair, child in children.items()}, times
    finally:
        for child in children.values():
            child.discard()


def _run_rounds(children: Dict[Pair, PacedChild], times: RoundTimes, options: RoundsOptions,
                progress: Callable[[str], None]) -> None:
    used = {pair: options.warmup for pair in children}
    started = time.perf_counter()
    while True:
        active = [pair for pair, child in children.items() if child.paced and not child.finished]
        if len(active) < 2:
            times.stopped = "fewer than two runs were left to time (the others had ended: --max-steps, or an error)"
            return
        if times.rounds >= MIN_ROUNDS and _precise(times, active, options.precision):
            times.stopped = f"every speed ratio was within +-{options.precision:.0%} (95% interval)"
            return
        if time.perf_counter() - started > options.budget_s:
            times.stopped = f"the time budget ({options.budget_s:g}s) was spent"
            return
        if times.rounds >= MAX_ROUNDS:
            times.stopped = f"{MAX_ROUNDS} rounds were run"
            return
        order = list(children) if times.rounds % 2 == 0 else list(children)[::-1]
        for pair in order:
            child = children[pair]
            left = None if options.max_steps is None else options.max_steps - used[pair]
            measured = child.run_slice(_slice_steps(times.wall[pair], left, times.rounds)) \
                if pair in active else None
            used[pair] += REWARM_STEPS + (len(measured.wall) if measured is not None else 0)
            times.add(pair, measured)
        times.rounds += 1
        if times.rounds in (MIN_ROUNDS, 2 * MIN_ROUNDS) or times.rounds % 25 == 0:
            progress(f"round {times.rounds} ({time.perf_counter() - started:.0f}s)")
