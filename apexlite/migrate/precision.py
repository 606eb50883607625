"""`migrate --verify`'s precision check: did the migrated script run its layers in low precision where the
original did? Losses can agree while a forward the migration left outside autocast runs in float32; the
counts of apexlite.amp.layer_precision (dtypes Linear/Conv layers returned, by grad mode) show it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from apexlite.amp.layer_precision import NO_GRAD, TRAINING, low_share

Counts = Dict[str, Dict[str, int]]
MARGIN = 0.01  # shares closer than this are alike (a forward before amp.initialize, say)
DESCRIBED = {TRAINING: "while training", NO_GRAD: "under no_grad (evaluation, a teacher)"}


@dataclass
class PrecisionCheck:
    """The lines to print, and what the migrated run lost (None when its training layers kept low precision)."""

    lines: List[str]
    lost: Optional[str]


def _share_text(counts: Dict[str, int]) -> str:
    share = low_share(counts)
    total = sum(counts.values())
    return "no layer ran" if share is None else f"{share:.0%} ({round(share * total)} of {total})"


def check_precision(original: Counts, migrated: Counts) -> PrecisionCheck:
    """Compare the two runs' low-precision shares, per grad mode; only training layers count as lost."""
    lines: List[str] = []
    lost = None
    for mode in (TRAINING, NO_GRAD):
        before, after = original.get(mode, {}), migrated.get(mode, {})
        if not before and not after:
            continue
        lines.append(f"verify: Linear/Conv layers returning float16/bfloat16 {DESCRIBED[mode]}: original "
                     f"{_share_text(before)}, migrated {_share_text(after)}")
        was, now = low_share(before), low_share(after)
        if was is None or now is None or now >= was - MARGIN:
            continue
        if mode == TRAINING:
            lost = (f"the migrated script ran {1 - now:.0%} of its training layers in float32, where the original "
                    f"ran {was:.0%} of them in low precision: a forward pass is outside torch.autocast; put it under "
                    "the autocast region of its loss")
        else:
            lines.append("verify: note: forwards under no_grad run in float32 now where the original ran them in "
                         "low precision (the `# apexlite migrate:` comments name them): slower, not less accurate")
    return PrecisionCheck(lines, lost)
