"""`apex.amp.opt`: the old API's optimizer wrapper (what `handle.wrap_optimizer` returns)."""
from apexlite.amp.handle import OptimWrapper  # noqa: F401
from apexlite.compat import generic

__getattr__ = generic.fallback_getattr(__name__)
