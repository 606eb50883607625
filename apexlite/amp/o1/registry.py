"""User cast annotations: `half_function`-style decorators and `register_*_function` registrations.

Registrations are recorded before `initialize` and applied (then forgotten, as in apex) by the next
O1 session. Decorated functions consult the current session on each call: they cast only while an O1
session with casts enabled is active and pass straight through otherwise.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Tuple

from apexlite._logging import get_logger
from apexlite.amp.o1.policies import CastPolicy

log = get_logger("amp")


class PendingRegistrations:
    """(module, name, policy) triples waiting for the next O1 `initialize`."""

    items: List[Tuple[Any, str, CastPolicy]] = []

    @classmethod
    def add(cls, module: Any, name: str, policy: CastPolicy) -> None:
        if isinstance(module, str):
            raise ValueError(f"register_*_function takes the module object, not its name: write "
                             f"(`{module}`, {name!r}) without quotes around {module}, after `import {module}`.")
        if not hasattr(module, name):
            raise ValueError(f"No function named {name} in module {module}.")
        cls.items.append((module, name, policy))
        from apexlite.amp.session import current_session  # (the session module imports this one)

        session = current_session(required=False)
        if session is not None and session.patches_torch:
            log.warning("amp.register_*_function(%s, %r) after amp.initialize: it takes effect at the next "
                        "amp.initialize, as in apex, not in this session. Register before initialize.",
                        getattr(module, "__name__", module), name)

    @classmethod
    def take(cls) -> List[Tuple[Any, str, CastPolicy]]:
        items, cls.items = cls.items, []
        return items

    @classmethod
    def put_back(cls, items: List[Tuple[Any, str, CastPolicy]]) -> None:
        """Return registrations taken by an `initialize` that failed, ahead of any made since."""
        cls.items = list(items) + cls.items


def register_half_function(module: Any, name: str) -> None:
    """Cast the floating inputs of `module.name` to the low-precision dtype under O1 (call before initialize)."""
    PendingRegistrations.add(module, name, CastPolicy.LOW_PRECISION)


def register_float_function(module: Any, name: str) -> None:
    """Cast the floating inputs of `module.name` to fp32 under O1 (call before initialize)."""
    PendingRegistrations.add(module, name, CastPolicy.FLOAT)


def register_promote_function(module: Any, name: str) -> None:
    """Promote the floating inputs of `module.name` to their widest dtype under O1 (call before initialize)."""
    PendingRegistrations.add(module, name, CastPolicy.PROMOTE)


def _decorator(policy: CastPolicy) -> Callable[[Callable], Callable]:
    from apexlite.amp.o1.wrappers import make_wrapper

    def decorate(fn: Callable) -> Callable:
        name = getattr(fn, "__qualname__", repr(fn))
        wrappers = {}

        @functools.wraps(fn)
        def call(*args, **kwargs):
            from apexlite.amp.session import current_session

            session = current_session(required=False)
            if session is None or not session.cast_state.enabled:
                return fn(*args, **kwargs)
            wrapper = wrappers.get(id(session))
            if wrapper is None:
                wrappers.clear()
                wrapper = wrappers[id(session)] = make_wrapper(policy, session.cast_state, fn, name)
            return wrapper(*args, **kwargs)

        return call

    return decorate


half_function = _decorator(CastPolicy.LOW_PRECISION)
half_function.__doc__ = "Decorator: under O1, cast the function's floating inputs to the low-precision dtype."
float_function = _decorator(CastPolicy.FLOAT)
float_function.__doc__ = "Decorator: under O1, cast the function's floating inputs to fp32."
promote_function = _decorator(CastPolicy.PROMOTE)
promote_function.__doc__ = "Decorator: under O1, promote the function's floating inputs to their widest dtype."
