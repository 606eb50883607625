"""Chooses, per session, between the native O1 cast path (apexlite._C) and the pure-Python one.

The native path (csrc/torch/o1_*.cpp) runs the LOW_PRECISION, FLOAT, PROMOTE and SEQUENCE_PROMOTE
wrappers, the cast cache and the cast switches in C++, with the semantics of wrappers.py, cache.py
and cast_state.py, which remain the reference and the fallback: without the extension, or with
APEXLITE_DISABLE_EXTENSION=1, sessions use them. wrapt installs and removes every patch either way;
only the wrapper callable it holds differs. Banned, in-place and match-self wrappers stay in Python.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional

import torch

from apexlite._logging import get_logger
from apexlite._native import loader
from apexlite._native.build_plan import extension_disabled
from apexlite.amp.o1.cache import CastCache
from apexlite.amp.o1.cast_state import CastState, CastSwitches
from apexlite.amp.o1.policies import CastPolicy

DISABLE_ENV = "APEXLITE_DISABLE_EXTENSION"
# policy -> the code csrc/torch/o1_casts.h uses for it
NATIVE_POLICIES = {CastPolicy.LOW_PRECISION: 0, CastPolicy.FLOAT: 1, CastPolicy.PROMOTE: 2,
                   CastPolicy.SEQUENCE_PROMOTE: 3}

log = get_logger("amp.casts")


@functools.lru_cache(maxsize=None)
def _native_module() -> Optional[Any]:
    """apexlite's CPU library (installed apexlite._C, or compiled on first use) when it carries the O1 cast
    types, else None (looked up once; see apexlite/_native/loader.py)."""
    compiled = loader.native_module()
    return compiled if hasattr(compiled, "CastWrapper") else None


def status() -> str:
    """'native' or 'python (reason)': the path a new session's O1 wrappers take."""
    if extension_disabled():
        return f"python ({DISABLE_ENV}={os.environ[DISABLE_ENV]})"
    if _native_module() is None:
        return f"python (apexlite's compiled casts are not available: {loader.status().detail})"
    return "native"


def use_native() -> bool:
    return status() == "native"


@functools.lru_cache(maxsize=None)
def _native_state_class() -> type:
    compiled = _native_module()

    class NativeCastState(CastSwitches, compiled.CastState):  # type: ignore[misc,name-defined]
        """CastState's interface over apexlite._C.CastState (whose fields the C++ wrappers read; its
        push/pop_disabled and `enabled` keep the per-thread depth in C++)."""

        def __init__(self, low_dtype: torch.dtype, cache: Any, log_casts: bool = False,
                     allow_banned: bool = False, use_cache: bool = True) -> None:
            self._set_options(low_dtype, cache, log_casts, allow_banned, use_cache)

        def _store_device_types(self, device_types: Any) -> None:
            compiled.CastState.device_types.__set__(self, device_types)

        @property
        def thread(self) -> "NativeCastState":
            """What Python wrappers read `disabled_depth` from (per thread, in C++ storage)."""
            return self

        @staticmethod
        def _log_cast(source: torch.dtype, target: torch.dtype, name: str) -> None:
            log.debug("%s->%s (%s)", source, target, name)

    return NativeCastState


def make_cache_and_state(low_dtype: torch.dtype, native: Optional[bool] = None) -> tuple:
    """(cache, cast state) of one session, native when available unless `native` says otherwise."""
    if use_native() if native is None else native:
        cache = _native_module().CastCache()
        return cache, _native_state_class()(low_dtype, cache)
    cache = CastCache()
    return cache, CastState(low_dtype, cache)


def native_wrapper(policy: CastPolicy, state: Any, original: Callable, name: str) -> Optional[Callable]:
    """The C++ wrapper for `policy` when `state` is native and the policy is one it implements."""
    compiled = _native_module()
    if compiled is None or not isinstance(state, compiled.CastState) or policy not in NATIVE_POLICIES:
        return None
    return compiled.CastWrapper(NATIVE_POLICIES[policy], state, original, name)
