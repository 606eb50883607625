"""`apex` as legacy scripts import it: amp, optimizers, parallel, fp16_utils, normalization,
multi_tensor_apply and RNN, all backed by apexlite. See MIGRATION.md for per-API differences."""
from __future__ import annotations

import warnings

import torch

from apexlite.compat.apex import (  # noqa: F401  (imported so `apex.<name>` works after `import apex`)
    RNN, amp, fp16_utils, multi_tensor_apply, normalization, optimizers,
)

__all__ = ["RNN", "amp", "fp16_utils", "multi_tensor_apply", "normalization", "optimizers",
           "DeprecatedFeatureWarning", "deprecated_warning"]

if torch.distributed.is_available():
    from apexlite.compat.apex import parallel  # noqa: F401

    __all__.append("parallel")


class DeprecatedFeatureWarning(FutureWarning):
    """The warning category apex used for its deprecated features."""


def deprecated_warning(msg: str) -> None:
    """Warn with DeprecatedFeatureWarning on rank 0 only (or everywhere when not distributed)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=2)
