"""Known mixed-precision traps, recognised from the configuration before the first step.

Each trap here is reproduced by tests/amp/test_advice.py, which trains into it:

* O3 in fp16 (fp16 weights, no fp32 masters) with a torch.optim optimizer that divides by
  sqrt(v) + eps: eps=1e-8 is below fp16's smallest subnormal (about 6e-8), so it rounds to 0;
  where v underflows too the update is 0/0 and the weights turn NaN within a step or two.
  Fixes: O2 (fp32 masters, the optimizer works in fp32), eps >= 1e-4, or dtype=torch.bfloat16
  (fp32's exponent range).

One slow path is named too, once per process: float16 on CPU. torch has few fast float16 CPU kernels,
so O1-O3 in float16 on a CPU model can run several times slower per step than fp32, O1's float16
matmuls as much as O2/O3's float16 weights (BENCHMARKS.md, "O0-O3 on a tiny transformer (CPU)": every
float16 level 4-9x the step time of fp32 (95% intervals), bfloat16 1.0-2.5x).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

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
                "the update becomes 0/0 = NaN within a few steps. Use "
                + ("master_weights=True (fp32 master weights)" if level == "O2" else
                   "opt_level='O2' (fp32 master weights)")
                + f", or eps>={MIN_FP16_EPS:g}, or dtype=torch.bfloat16."
            )
    return messages


class SlowCpuHalf:
    """Says once per process that float16 on CPU is slow, and what runs faster there."""

    said = False

    @staticmethod
    def message(properties: Any, models: Sequence[Any], low_dtype: torch.dtype) -> Optional[str]:
        """The advice when this configuration computes in float16 on a CPU model, else None."""
        half_weights = getattr(properties, "cast_model_type", None) is torch.float16
        if low_dtype is not torch.float16 or not (half_weights or getattr(properties, "patch_torch_functions", False)):
            return None
        if not any(param.device.type == "cpu" for model in models for param in model.parameters()):
            return None
        level = getattr(properties, "opt_level", "this opt level")
        what = "keeps float16 weights" if half_weights else "runs matmuls and convolutions in float16"
        return (f"{level} {what} on CPU, where torch has few fast float16 kernels: a step can run several "
                "times slower than in fp32, at O1 as at O2/O3. On CPU use dtype=torch.bfloat16 (or "
                "APEXLITE_DTYPE=bfloat16), usually much faster there, or opt_level='O0' (fp32). "
                "(Said once per process.)")

    @classmethod
    def advise(cls, properties: Any, models: Sequence[Any], low_dtype: torch.dtype) -> Optional[str]:
        """Log the advice (rank 0) the first time a configuration calls for it; returns it when logged."""
        message = None if cls.said else cls.message(properties, models, low_dtype)
        if message is not None:
            cls.said = True
            if is_rank_zero():
                log.warning(message)
        return message


def warn_known_traps(properties: Any, optimizers: Sequence[Any], low_dtype: torch.dtype,
                     models: Sequence[Any] = (), advise: bool = True) -> List[str]:
    """Log a warning (rank 0) for each known trap of this configuration, and, when ``advise`` (verbosity >= 1),
    the slow-path advice for `models` (SlowCpuHalf); returns the trap messages."""
    messages = find_known_traps(properties, optimizers, low_dtype)
    if is_rank_zero():
        for message in messages:
            log.warning(message)
    if advise:
        SlowCpuHalf.advise(properties, models, low_dtype)
    return messages
