"""Speed ratios with their uncertainty, from step times measured round by round.

In every round each combination runs one slice of steps right after the other, so the two slices of a
pair saw nearly the same machine. A pair's speed ratio in one round is (reference's median step time in
the slice) / (other's): above 1 the other is faster. The ratio reported is the median of those per-round
ratios and its interval is the order-statistic (sign-test) interval for that median: with n rounds,
[r_(k), r_(n+1-k)] of the sorted ratios for the largest k whose coverage, 1 - 2 P(B <= k - 1) with
B ~ Binomial(n, 1/2), is at least 95%. It assumes nothing about the shape of the noise (heavy tails,
outliers, skew: a round that was disturbed moves the interval by one rank at most), needs at least
6 rounds (2 x 0.5^6 < 5%) and tightens as rounds are added.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

CONFIDENCE = 0.95
MIN_ROUNDS = 6  # the fewest rounds whose outermost ratios cover the median with 95%: 1 - 2 * 0.5**6 = 0.969
MAX_SPREAD = 1.5  # an interval whose high end is more than this times its low end says too little to report


def coverage(n: int, k: int) -> float:
    """The chance that [x_(k), x_(n+1-k)] of n independent draws holds their distribution's median."""
    return 1 - 2 * sum(math.comb(n, below) for below in range(k)) / 2 ** n


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Optional[Tuple[float, float]]:
    """The distribution-free interval that covers the median of `values`' distribution with at least
    `confidence` (independent draws), or None when there are too few values for that confidence."""
    ordered = sorted(values)
    n = len(ordered)
    widest_allowed = [k for k in range(1, n // 2 + 1) if coverage(n, k) >= confidence]
    if not widest_allowed:
        return None
    k = max(widest_allowed)  # coverage falls as k grows: the narrowest interval that still covers
    return ordered[k - 1], ordered[n - k]


@dataclass(frozen=True)
class SpeedRatio:
    """How fast `other` ran relative to `reference`: the median per-round ratio and its 95% interval."""

    estimate: Optional[float]
    low: Optional[float]
    high: Optional[float]
    rounds: int

    @property
    def measured(self) -> bool:
        """True when the interval exists and is narrow enough to say something (high <= MAX_SPREAD x low)."""
        return self.low is not None and self.high is not None and self.high <= MAX_SPREAD * self.low

    @property
    def verdict(self) -> str:
        """faster / slower (the whole interval on one side of 1), no measurable difference, or not measured."""
        if not self.measured:
            return "not measured"
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "no measurable difference"

    def precise_to(self, precision: float) -> bool:
        """True when the interval lies within +-`precision` (a fraction) of the estimate."""
        return (self.measured and self.estimate is not None
                and max(self.high - self.estimate, self.estimate - self.low) <= precision * self.estimate)

    def text(self) -> str:
        """`2.31x [2.10, 2.52]`, or why there is no interval (then no ratio is shown either)."""
        if self.estimate is None:
            return "not measured (no round timed both)"
        if self.low is None:  # an estimate is never printed without its interval
            return f"not measured ({self.rounds} rounds; {MIN_ROUNDS} give an interval)"
        return f"{self.estimate:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def round_ratios(reference: Sequence[Optional[float]], other: Sequence[Optional[float]]) -> List[float]:
    """reference / other for every round both timed (a round either missed is left out)."""
    return [ref / oth for ref, oth in zip(reference, other) if ref and oth]


def speed_ratio(reference: Sequence[Optional[float]], other: Sequence[Optional[float]]) -> SpeedRatio:
    """The speed of `other` relative to `reference` from their per-round step times (same round order)."""
    ratios = round_ratios(reference, other)
    if not ratios:
        return SpeedRatio(None, None, None, 0)
    interval = median_interval(ratios)
    low, high = interval if interval is not None else (None, None)
    return SpeedRatio(statistics.median(ratios), low, high, len(ratios))
