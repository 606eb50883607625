"""What the rounds say about speed: each combination's step time, every pair's ratio with its interval, and
whether the timings say anything at all (they do not when most steps waited for a CPU)."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from apexlite.sweep.intervals import MAX_SPREAD, MIN_ROUNDS, SpeedRatio, median_interval, speed_ratio
from apexlite.sweep.rounds import WAIT_SHARE, RoundTimes

Pair = Tuple[str, str]


def _label(pair: Pair) -> str:
    return f"{pair[0]} {pair[1]}"


class SpeedTable:
    """Step times and speed ratios read from the rounds of one sweep (all repeats pooled)."""

    def __init__(self, times: RoundTimes) -> None:
        self.times = times

    def step_time_ms(self, pair: Pair) -> Optional[float]:
        """Median over rounds of the pair's undisturbed step time; None when no round timed it."""
        values = [value for value in self.times.wall.get(pair, []) if value]
        return statistics.median(values) * 1e3 if values else None

    def step_time_interval_ms(self, pair: Pair) -> Optional[Tuple[float, float]]:
        """The 95% interval of that median (intervals.py); None below MIN_ROUNDS timed rounds."""
        interval = median_interval([value for value in self.times.wall.get(pair, []) if value])
        return None if interval is None else (interval[0] * 1e3, interval[1] * 1e3)

    def timed_rounds(self, pair: Pair) -> int:
        return sum(1 for value in self.times.wall.get(pair, []) if value)

    def ratio(self, reference: Pair, other: Pair) -> SpeedRatio:
        """How fast `other` ran relative to `reference` (above 1: faster), from the rounds that timed both."""
        return speed_ratio(self.times.wall.get(reference, []), self.times.wall.get(other, []))

    def disturbed_share(self) -> Optional[float]:
        """The share of all timed steps that waited for a CPU (None when nothing was timed)."""
        steps = sum(self.times.steps.values())
        return sum(self.times.disturbed.values()) / steps if steps else None

    def why_not_measured(self, pairs: List[Pair]) -> str:
        """Why no ratio among `pairs` could be given, in one sentence."""
        share = self.disturbed_share()
        if share is not None and share > 0.5:
            return (f"{share:.0%} of the timed steps waited for a CPU (other processes were using the cores), "
                    f"and a step that waited more than {WAIT_SHARE:.0%} of its time is not counted")
        rounds = max((self.timed_rounds(pair) for pair in pairs), default=0)
        if rounds < MIN_ROUNDS:
            return (f"at most {rounds} rounds timed a combination; a 95% interval needs {MIN_ROUNDS} "
                    "(give more --max-steps or --budget)")
        return (f"the round-to-round spread was too large: no 95% interval's high end was within {MAX_SPREAD:g} "
                "times its low end (re-run on an idle machine, or with a larger --budget)")

    def report_lines(self, baseline: Pair, pairs: List[Pair]) -> List[str]:
        """The speed section of the report: every pair against `baseline`, each with its interval."""
        others = [pair for pair in pairs if pair != baseline]
        ratios = {pair: self.ratio(baseline, pair) for pair in others}
        header = (f"speed relative to {_label(baseline)} (median of per-round ratios of step times, 95% interval; "
                  f"{self.times.rounds} rounds, ended because {self.times.stopped or 'no round was run'}):")
        if not any(ratio.measured for ratio in ratios.values()):
            return [f"speed could not be measured: {self.why_not_measured(pairs)}."]
        width = max(len(_label(pair)) for pair in others)
        lines = [header]
        for pair, ratio in ratios.items():
            if ratio.low is None:
                lines.append(f"  {_label(pair):{width}}  {ratio.text()}")
            else:
                lines.append(f"  {_label(pair):{width}}  {ratio.text():24}  {ratio.verdict}"
                             + ("" if ratio.measured else " (interval too wide)"))
        return lines

    def notes(self, pairs: List[Pair]) -> List[str]:
        """Disturbed steps per combination, and whether the platform could see them at all."""
        if not self.times.waits_visible:
            return ["this platform does not report how long threads waited for a CPU (Linux schedstat): steps "
                    "slowed by other processes could not be left out"]
        counts = [f"{_label(pair)} {self.times.disturbed[pair]}/{self.times.steps[pair]}" for pair in pairs
                  if self.times.steps.get(pair) and self.times.disturbed[pair]]
        if not counts:
            return []
        return ["timed steps left out because they waited for a CPU (another process was running): "
                + ", ".join(counts)]

    def summary(self, baseline: Optional[Pair], pairs: List[Pair]) -> Dict[str, Any]:
        """The JSON form: rounds, why they ended, and every pair's ratio against the baseline."""
        ratios = []
        for pair in pairs:
            if baseline is None or pair == baseline:
                continue
            ratio = self.ratio(baseline, pair)
            ratios.append({"opt_level": pair[0], "dtype": pair[1], "estimate": ratio.estimate, "low": ratio.low,
                           "high": ratio.high, "rounds": ratio.rounds, "verdict": ratio.verdict})
        return {"baseline": None if baseline is None else _label(baseline), "rounds": self.times.rounds,
                "stopped": self.times.stopped, "disturbed_share": self.disturbed_share(),
                "waits_visible": self.times.waits_visible, "ratios": ratios}
