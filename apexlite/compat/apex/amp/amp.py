"""`apex.amp.amp`: the old `amp.init` entry point and the function registries."""
from __future__ import annotations

from apexlite.amp.registry import (  # noqa: F401
    float_function, half_function, promote_function, register_float_function,
    register_half_function, register_promote_function,
)
from apexlite.compat._unsupported import ApexliteUnsupportedError, unsupported_message
from apexlite.compat.apex.amp.handle import NoOpHandle


def init(enabled: bool = True, loss_scale: object = "dynamic", enable_caching: bool = True,
         verbose: bool = False, allow_banned: bool = False) -> NoOpHandle:
    """The pre-2019 handle API. `enabled=False` returns a no-op handle, as apex did; otherwise it
    raises, because the old API's per-optimizer wrappers are not implemented."""
    if not enabled:
        return NoOpHandle()
    raise ApexliteUnsupportedError(unsupported_message(
        "amp.init() (the pre-2019 amp handle API)",
        "Use model, optimizer = amp.initialize(model, optimizer, opt_level='O1'), which applies the same "
        "O1 casts, and `with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`.",
    ))
