"""`apex.amp.handle`: scale_loss, disable_casts and the old-API handle classes."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from apexlite.amp.scale_loss import disable_casts, scale_loss  # noqa: F401
from apexlite.compat._unsupported import unsupported

AmpHandle = unsupported(
    "apex.amp.handle.AmpHandle (the pre-2019 amp.init API)",
    "Use model, optimizer = amp.initialize(model, optimizer, opt_level='O1') and `with amp.scale_loss(...)`.",
)


class NoOpHandle:
    """What `amp.init(enabled=False)` returns: casts inactive, `scale_loss` yields the loss unchanged."""

    has_cache = False
    verbose = False

    def is_active(self) -> bool:
        return False

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def scale_loss(self, loss: Any, optimizer: Any) -> Iterator[Any]:
        yield loss

    def wrap_optimizer(self, optimizer: Any, num_loss: int = 1) -> Any:
        return optimizer

    def _clear_cache(self) -> None:
        """Nothing is cached when amp is disabled."""

    def _deactivate(self) -> None:
        """Nothing was patched when amp is disabled."""
