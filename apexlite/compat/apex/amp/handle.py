"""`apex.amp.handle`: scale_loss, disable_casts and the old-API handle classes."""
from __future__ import annotations

from apexlite.amp.handle import AmpHandle, NoOpHandle  # noqa: F401
from apexlite.amp.scale_loss import disable_casts, scale_loss  # noqa: F401
from apexlite.compat import generic

__getattr__ = generic.fallback_getattr(__name__)
