"""`apex.amp.amp`: the old `amp.init` entry point and the function registries."""
from __future__ import annotations

from apexlite.amp.handle import init  # noqa: F401
from apexlite.amp.o1.registry import (  # noqa: F401
    float_function, half_function, promote_function, register_float_function,
    register_half_function, register_promote_function,
)
from apexlite.compat import generic

__getattr__ = generic.fallback_getattr(__name__)
