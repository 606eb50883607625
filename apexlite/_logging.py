"""The apexlite logger: rank-0 aware, visible by default, silent when the application configures logging."""
from __future__ import annotations

import logging
import sys

import torch

LOGGER_NAME = "apexlite"


def _root_has_no_handlers(record: logging.LogRecord) -> bool:
    """Emit through our own handler only when the application has not configured logging itself."""
    return not logging.getLogger().handlers


def _install_default_handler() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_apexlite_default", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_root_has_no_handlers)
        handler._apexlite_default = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return logger


logger = _install_default_handler()


def get_logger(name: str) -> logging.Logger:
    """A child of the apexlite logger (``apexlite.<name>``)."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def is_rank_zero() -> bool:
    """True unless torch.distributed is initialised with world size > 1 and this is not rank 0."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return True
    return dist.get_world_size() <= 1 or dist.get_rank() == 0
