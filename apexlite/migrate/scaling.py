"""Loss scaling or arithmetic? What `migrate --verify` says when two loss curves differ.

apex keeps one loss scaler per loss (`num_losses`, `loss_id`); torch's recipe, which migrate follows, is
one GradScaler per optimizer. Where losses share an optimizer (a GAN's discriminator), an overflow then
halves a different scale and the runs skip different steps, and a GAN amplifies one different step. So
when the curves differ, verify compares how each run scaled its losses: the steps it skipped and the
scale each loss was multiplied by. The same scaling means the arithmetic differs. Different scaling
means both runs go again under one static loss scale (APEXLITE_LOSS_SCALE for the original, every
GradScaler held at that scale for the migrated script, both still skipping overflowing steps): if they
agree then, the loss scaling was the difference; if not, the arithmetic is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

# A static scale of 1.0 makes apexlite skip its overflow check (nothing to unscale) while a GradScaler
# still checks; from 2 up both check and skip alike.
MIN_STATIC_SCALE = 2.0


@dataclass
class Scaling:
    """How one run scaled its losses: the steps it skipped, the scale of each loss (None: not scaled)."""

    skipped: List[int]
    scales: List[Optional[float]]


def scaling_of(skipped_at: Sequence[int], scale_curve: Sequence[Sequence]) -> Scaling:
    return Scaling(list(skipped_at), [point[1] for point in scale_curve])


def _factor(scale: Optional[float]) -> float:
    """What the loss was multiplied by: an unscaled loss by 1, the same as a scale of 1."""
    return 1.0 if scale is None else scale


def first_scale_difference(original: Scaling, migrated: Scaling) -> Optional[int]:
    """Index of the first loss the two runs multiplied by different scales (over the losses both recorded)."""
    return next((index for index, (a, b) in enumerate(zip(original.scales, migrated.scales))
                 if _factor(a) != _factor(b)), None)


def scaling_differs(original: Scaling, migrated: Scaling) -> bool:
    return original.skipped != migrated.skipped or first_scale_difference(original, migrated) is not None


def static_scale_for(original: Scaling, migrated: Scaling) -> float:
    """The smallest scale either run used (the dynamic scalers' own verdict on what does not overflow),
    at least MIN_STATIC_SCALE; 2**16, the dynamic scalers' start, when neither run recorded a scale."""
    used = [scale for scale in original.scales + migrated.scales if scale is not None]
    return max(min(used), MIN_STATIC_SCALE) if used else 2.0 ** 16


def steps_text(steps: Sequence[int]) -> str:
    return f"[{', '.join(map(str, steps))}]" if steps else "none"


def describe_difference(original: Scaling, migrated: Scaling, steps: Sequence[int]) -> str:
    """One sentence: which steps each run skipped and the first loss they scaled differently.
    `steps`: the step each loss fed (to name where the scales part)."""
    text = f"original skipped steps {steps_text(original.skipped)}, migrated skipped {steps_text(migrated.skipped)}"
    index = first_scale_difference(original, migrated)
    if index is not None:
        step = f", step {steps[index]}" if index < len(steps) else ""
        text += (f"; the scales part at loss {index + 1}{step}: {_scale_text(original.scales[index])} in the original, "
                 f"{_scale_text(migrated.scales[index])} in the migrated script")
    return text


def _scale_text(scale: Optional[float]) -> str:
    return "unscaled" if scale is None else f"{scale:g}"
