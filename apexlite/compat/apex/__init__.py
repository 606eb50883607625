"""`apex` as legacy scripts import it, backed by apexlite; see MIGRATION.md for per-API differences.

Its modules follow apex's tree (apexlite/compat/apex_tree.tsv): apexlite's own modules for what it
implements (amp, optimizers, parallel, fp16_utils, normalization, multi_tensor_apply, ...), generic
placeholder modules for what apex imported without its extensions and apexlite does not implement
(`apex.transformer`, reachable as an attribute as in apex), and an ImportError naming the alternative for
what apex refused to import without them (`apex.mlp`, `apex.contrib.xentropy`, ...).
"""
from __future__ import annotations

import logging
import warnings

import torch

from apexlite.compat import generic
from apexlite.compat.apex import amp, fp16_utils, multi_tensor_apply, normalization, optimizers  # noqa: F401

__all__ = ["amp", "fp16_utils", "optimizers", "normalization", "transformer"]

if torch.distributed.is_available():
    from apexlite.compat.apex import parallel  # noqa: F401

    __all__.append("parallel")


class RankInfoFormatter(logging.Formatter):
    """A log formatter that also fills `%(rank_info)s`: this process's torch.distributed rank, or 0."""

    def format(self, record: logging.LogRecord) -> str:
        dist = torch.distributed
        record.rank_info = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return super().format(record)


# apex attached this handler to its `apex` logger; apexlite logs to `apexlite` and leaves `apex` alone.
handler = logging.StreamHandler()
handler.setFormatter(RankInfoFormatter("%(asctime)s - PID:%(process)d - rank:%(rank_info)s - %(filename)s:%(lineno)d "
                                       "- %(levelname)s - %(message)s", "%y-%m-%d %H:%M:%S"))


def check_cudnn_version_and_warn(global_option: str, required_cudnn_version: int) -> bool:
    """Whether cuDNN >= `required_cudnn_version` is available; warns (naming `global_option`) when not."""
    available = torch.backends.cudnn.is_available()
    version = torch.backends.cudnn.version() if available else None
    if available and version >= required_cudnn_version:
        return True
    warnings.warn(f"`{global_option}` needs cuDNN {required_cudnn_version} or later, but "
                  f"{'cuDNN is not available' if not available else f'the version is {version}'}", stacklevel=2)
    return False


class DeprecatedFeatureWarning(FutureWarning):
    """The warning category apex used for its deprecated features."""


def deprecated_warning(msg: str) -> None:
    """Warn with DeprecatedFeatureWarning on rank 0 only (or everywhere when not distributed)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        warnings.warn(msg, DeprecatedFeatureWarning, stacklevel=2)


__getattr__ = generic.fallback_getattr(__name__)
