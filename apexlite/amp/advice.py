"""Known mixed-precision traps, recognised from the configuration before the first step.

Each trap here is reproduced by tests/amp/test_advice.py, which trains into it:

* O3 in fp16 (fp16 weights, no fp32 masters) with a torch.optim optimizer that divides by
  sqrt(v) + eps: eps=1e-8 is below fp16's smallest subnormal (about 6e-8), so it rounds to 0;
  where v underflows too the update is 0/0 and the weights turn NaN within a step or two.
  Fixes: O2 (fp32 masters, the optimizer works in fp32), eps >= 1e-4, or dtype=torch.bfloat16
  (fp32's exponent range).
"""
from __future__ import annotations

from typing import Any, List, Sequence

import torch

from apexlite._logging import get_logger, is_rank_zero

log = get_logger("amp")

# torch.optim classes whose update divides by sqrt(second moment) + eps, computed in the params' dtype
SQRT_EPS_OPTIMIZERS = ("Adam", "AdamW", "NAdam", "RAdam", "RMSprop")
# the smallest eps that keeps sqrt(v) + eps away from 0 in fp16 with room to spare
MIN_FP16_EPS = 1e-4


def _half_params_without_masters(properties: Any, low_dtype: torch.dtype) -> bool:
    return (low_dtype is torch.float16 and getattr(properties, "cast_model_type", None) is torch.float16
            and not getattr(properties, "master_weights", False))


def _sqrt_eps_optimizer_class(optimizer: Any) -> str:
    """The name of the SQRT_EPS_OPTIMIZERS class whose step() `optimizer` runs, else ''.

    A subclass that keeps torch's step() falls into the same trap; one with its own step() may
    compute differently, so it is not guessed at.
    """
    known = {getattr(torch.optim, name, None): name for name in SQRT_EPS_OPTIMIZERS}
    for cls in type(optimizer).__mro__:  # most derived first: AdamW before the Adam it extends
        if cls in known:
            return known[cls] if type(optimizer).step is cls.step else ""
    return ""


def find_known_traps(properties: Any, optimizers: Sequence[Any], low_dtype: torch.dtype) -> List[str]:
    """One message per trap this configuration falls into (empty when none)."""
    if not _half_params_without_masters(properties, low_dtype):
        return []
    messages = []
    for optimizer in optimizers:
        name = _sqrt_eps_optimizer_class(optimizer)
        small = sorted({group.get("eps") for group in getattr(optimizer, "param_groups", [])
                        if isinstance(group.get("eps"), (int, float)) and group["eps"] < MIN_FP16_EPS})
        if name and small:
            level = getattr(properties, "opt_level", "O3")
            messages.append(
                f"{level} in float16 with torch.optim.{name}(eps={small[0]:g}) diverges: the optimizer "
                f"works on fp16 weights, where eps={small[0]:g} rounds to 0 and sqrt(v) underflows, so "
                "the update becomes 0/0 = NaN within a few steps. Use opt_level='O2' (fp32 master "
                f"weights), or eps>={MIN_FP16_EPS:g}, or dtype=torch.bfloat16."
            )
    return messages


def warn_known_traps(properties: Any, optimizers: Sequence[Any], low_dtype: torch.dtype) -> List[str]:
    """Log a warning (rank 0) for each known trap of this configuration; returns the messages."""
    messages = find_known_traps(properties, optimizers, low_dtype)
    if is_rank_zero():
        for message in messages:
            log.warning(message)
    return messages
