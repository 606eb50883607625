"""`apex.amp`: every public name of apex.amp, backed by apexlite.amp.

Every submodule of apex.amp is importable (`apex.amp._initialize`, `.lists.torch_overrides`, `.utils`,
...), and reachable as an attribute as in apex (loaded on first access). `amp._amp_state` is the state
object (as in apex), not the submodule.
"""
from apexlite.amp import (  # noqa: F401
    AmpConfigError, AmpStateError, AmpUsageError, deinitialize, disable_casts, float_function,
    half_function, initialize, load_state_dict, master_params, promote_function,
    register_float_function, register_half_function, register_promote_function, scale_loss, state_dict,
)
from apexlite.compat import generic
from apexlite.compat.apex.amp import frontend, handle, opt, scaler  # noqa: F401
from apexlite.compat.apex.amp.amp import init
from apexlite.compat.apex.amp._amp_state import _amp_state  # noqa: F401  (rebinds the name to the object)

VERSION = (0, 1, 0)
__version__ = "0.1.0"

__all__ = [
    "init", "initialize", "deinitialize", "scale_loss", "disable_casts", "state_dict", "load_state_dict",
    "master_params", "half_function", "float_function", "promote_function", "register_half_function",
    "register_float_function", "register_promote_function",
]
__getattr__ = generic.fallback_getattr(__name__)
