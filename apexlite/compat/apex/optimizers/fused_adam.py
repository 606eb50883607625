"""`apex.optimizers.fused_adam`: apex's FusedAdam (apexlite's fused Adam/AdamW).

2019 scripts built this name with the 2019 keywords (``max_grad_norm``, ``eps_inside_sqrt``,
``use_mt``, ``amp_scale_adjustment``) and called ``step(grads=..., output_params=..., scale=...)``
through the 2019 FP16_Optimizer; apex later moved that class to apex.contrib.optimizers. Built with
any of those keywords, this name returns the 2019 class, so such scripts run unchanged.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch  # noqa: F401  (apex's module names)

from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier  # noqa: F401
from apexlite.optimizers.fused_adam import FusedAdam as _FusedAdam

LEGACY_2019_KEYWORDS = frozenset({"max_grad_norm", "eps_inside_sqrt", "use_mt", "amp_scale_adjustment"})


class FusedAdam(_FusedAdam):
    __doc__ = _FusedAdam.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is FusedAdam and LEGACY_2019_KEYWORDS.intersection(kwargs):
            from apexlite.compat.apex.contrib.optimizers.fused_adam import FusedAdam as FusedAdam2019

            return FusedAdam2019(*args, **kwargs)
        return super().__new__(cls)


# inspect.signature(FusedAdam) reads __new__ first: show apex's constructor parameters, not *args/**kwargs
FusedAdam.__new__.__signature__ = inspect.signature(_FusedAdam.__init__)
