"""apex.amp's public API on modern PyTorch: `initialize`, `scale_loss` and friends."""
from apexlite.amp.errors import AmpConfigError, AmpStateError, AmpUsageError
from apexlite.amp.frontend import (
    deinitialize, initialize, load_state_dict, master_params, state_dict,
)
from apexlite.amp.legacy_state import legacy_flags as _amp_state
from apexlite.amp.o1.registry import (
    float_function, half_function, promote_function, register_float_function,
    register_half_function, register_promote_function,
)
from apexlite.amp.scale_loss import disable_casts, scale_loss

__version__ = "0.1.0"

__all__ = [
    "initialize", "deinitialize", "scale_loss", "disable_casts", "state_dict", "load_state_dict",
    "master_params", "_amp_state", "half_function", "float_function", "promote_function", "register_half_function",
    "register_float_function", "register_promote_function", "AmpConfigError", "AmpStateError",
    "AmpUsageError",
]


def __getattr__(name: str):
    """`amp.init`, apex's older handle API, loaded on first use from apexlite's apex tree (which imports this
    package), so that a script whose `from apex import amp` became `from apexlite import amp` keeps it."""
    if name == "init":
        from apexlite.compat.apex.amp.amp import init

        return init
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
