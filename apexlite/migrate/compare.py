"""Two loss curves, the original's and the migrated script's: do they train alike?

Each curve is a list of [step the loss feeds, loss or None for a non-finite one], in the order the
losses were computed. The curves are compared point by point; the relative difference of a point is
|migrated - original| / |original| (absolute when the original is 0); a point finite in one run and not
in the other differs infinitely. The verdict is "agree" when both runs recorded the same losses for
the same steps and no point differs by more than the tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

AGREE, DIFFER, INCOMPLETE = "agree", "differ", "incomplete"


@dataclass
class Comparison:
    points: int
    largest: float  # largest relative difference over the common points (0.0 with none)
    at_index: Optional[int]  # index of that point
    at_step: Optional[int]
    verdict: str
    reason: str


def relative_difference(original: Optional[float], migrated: Optional[float]) -> float:
    if original is None or migrated is None:
        return 0.0 if original is None and migrated is None else math.inf
    scale = abs(original)
    return abs(migrated - original) / scale if scale > 0 else abs(migrated - original)


def compare(original: Sequence[Sequence], migrated: Sequence[Sequence], tolerance: float) -> Comparison:
    """The comparison of two curves (see the module docstring)."""
    common = min(len(original), len(migrated))
    if common == 0:
        return Comparison(0, 0.0, None, None, INCOMPLETE, "a run recorded no loss: nothing to compare")
    differences: List[float] = [relative_difference(original[i][1], migrated[i][1]) for i in range(common)]
    index = max(range(common), key=lambda i: differences[i])
    largest = differences[index]
    comparison = Comparison(common, largest, index, original[index][0], AGREE, "")
    mismatched = next((i for i in range(common) if original[i][0] != migrated[i][0]), None)
    if len(original) != len(migrated):
        comparison.verdict = DIFFER
        comparison.reason = (f"the original recorded {len(original)} losses and the migrated script {len(migrated)}: "
                             "the training loops differ")
    elif mismatched is not None:
        comparison.verdict = DIFFER
        comparison.reason = (f"loss {mismatched + 1} feeds step {original[mismatched][0]} in the original and step "
                             f"{migrated[mismatched][0]} in the migrated script: they step at different times")
    elif largest > tolerance:
        comparison.verdict = DIFFER
        comparison.reason = f"the losses differ by up to {_percent(largest)} (tolerance {_percent(tolerance)})"
    else:
        comparison.reason = f"every loss within {_percent(tolerance)} of the original's"
    return comparison


def _percent(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3%}"
