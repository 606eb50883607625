"""`apex.optimizers`: FusedAdam (apexlite's fused kernel), FusedSGD/LAMB/NovoGrad/Adagrad and
FusedMixedPrecisionLamb.

FusedAdam is looked up lazily from apexlite.optimizers, so this module imports even where that
package cannot be (see `_adam_fallback`). The pre-2019 `FP16_Optimizer` is importable and raises when
constructed, naming the replacement.
"""
from __future__ import annotations

from typing import Any

from apexlite.compat._unsupported import unsupported_class
from apexlite.optimizers.fused_adagrad import FusedAdagrad
from apexlite.optimizers.fused_lamb import FusedLAMB
from apexlite.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from apexlite.optimizers.fused_novograd import FusedNovoGrad
from apexlite.optimizers.fused_sgd import FusedSGD

FP16_Optimizer = unsupported_class(
    "apex.optimizers.FP16_Optimizer (the pre-2019 optimizer wrapper)",
    "Use apex.fp16_utils.FP16_Optimizer, or better amp.initialize(model, optimizer, opt_level='O2').",
)

__all__ = ["FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad", "FusedMixedPrecisionLamb"]


def __getattr__(name: str) -> Any:
    if name == "FusedAdam":
        from apexlite.compat.apex.optimizers._adam_fallback import resolve_fused_adam

        return resolve_fused_adam()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
