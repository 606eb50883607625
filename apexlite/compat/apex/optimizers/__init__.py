"""`apex.optimizers`: FusedAdam (apexlite's fused kernel) and FusedSGD/LAMB/NovoGrad/Adagrad.

FusedAdam is looked up lazily from apexlite.optimizers, so this module imports even where that
package cannot be (see `_adam_fallback`). The pre-2019 `FP16_Optimizer` and FusedMixedPrecisionLamb
are importable and raise when constructed, naming the replacement.
"""
from __future__ import annotations

from typing import Any

from apexlite.compat._unsupported import unsupported_class
from apexlite.optimizers.fused_adagrad import FusedAdagrad
from apexlite.optimizers.fused_lamb import FusedLAMB
from apexlite.optimizers.fused_novograd import FusedNovoGrad
from apexlite.optimizers.fused_sgd import FusedSGD

FP16_Optimizer = unsupported_class(
    "apex.optimizers.FP16_Optimizer (the pre-2019 optimizer wrapper)",
    "Use apex.fp16_utils.FP16_Optimizer, or better amp.initialize(model, optimizer, opt_level='O2').",
)
FusedMixedPrecisionLamb = unsupported_class(
    "apex.optimizers.FusedMixedPrecisionLamb",
    "Use apex.optimizers.FusedLAMB with amp.initialize(..., opt_level='O2') for fp32 master weights.",
)

__all__ = ["FusedAdam", "FusedSGD", "FusedLAMB", "FusedNovoGrad", "FusedAdagrad"]


def __getattr__(name: str) -> Any:
    if name == "FusedAdam":
        from apexlite.compat.apex.optimizers._adam_fallback import resolve_fused_adam

        return resolve_fused_adam()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
