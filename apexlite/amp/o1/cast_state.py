"""CastState: the switches every O1 wrapper of a session reads on each call.

NOTE [cast switches are per thread]
`active` says whether the session wants O1 casts at all (set by `initialize`/`amp.init`, the same in
every thread). Turning casts off for a block (`amp.disable_casts()`, the optimizer step's internal
switch, a handle's `_disable_casts()`) is a per-thread depth counter, as torch.autocast's state is
thread-local: a block in one thread never changes what another thread computes, overlapping blocks
in two threads each restore exactly, and a new thread starts with casts on.

A block is left on the thread that entered it (CastsOffBlock): leaving it on another thread is a clear
error that changes no thread's state, and the entering thread can still leave it. Both cast paths
raise the same errors; leaving more blocks than were entered is one too.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, FrozenSet, Iterable, Optional

import torch

from apexlite.amp.o1.device_scope import normalized, scope_check

UNMATCHED_POP_MESSAGE = "CastState.pop_disabled() without a matching push_disabled() in this thread"


class _ThreadSwitches(threading.local):
    """Per-thread state, set up afresh in each thread that reads it.

    Instance attributes, not class-level defaults: torch.compile (torch 2.5's dynamo at least) reads a
    thread-local's class attribute instead of the thread's own value and guards nothing, so compiled code
    would keep casting inside `amp.disable_casts()`; an attribute set in `__init__` is read and guarded.
    """

    def __init__(self) -> None:
        self.disabled_depth = 0  # > 0 while this thread is inside a casts-off block
        self.in_forward = False  # this thread runs a registered model's forward (NOTE [cast cache lifetime])


class CastSwitches:
    """What both cast states share: the options, and `disabled()` over the state's own push/pop."""

    def _set_options(self, low_dtype: torch.dtype, cache: Any, log_casts: bool, allow_banned: bool,
                     use_cache: bool) -> None:
        self.active = True
        self.low_dtype = low_dtype
        self.cache = cache
        self.use_cache = use_cache
        self.log_casts = log_casts
        self.allow_banned = allow_banned
        self.device_types = None

    @property
    def device_types(self) -> Optional[FrozenSet[str]]:
        """The device types whose tensors are cast (None: every device; NOTE [device scope])."""
        return self._device_types

    @device_types.setter
    def device_types(self, device_types: Optional[Iterable[str]]) -> None:
        scope = None if device_types is None else normalized(device_types)
        self._store_device_types(scope)
        self._device_types = scope
        self.scope_check = scope_check(scope)  # what the Python wrappers call per tensor

    def _store_device_types(self, device_types: Optional[FrozenSet[str]]) -> None:
        """Where the native wrappers read the scope (nothing to do on the Python path)."""

    def disabled(self) -> "CastsOffBlock":
        """Casts off for the current thread inside the block (nesting-safe, exception-safe, thread-tied)."""
        return CastsOffBlock(self)


class CastsOffBlock(contextlib.ContextDecorator):
    """One `with` block of casts off, left on the thread that entered it.

    Every check runs before the thread's casts-off depth changes, so a refused exit (wrong thread,
    never entered) or a second entry changes nothing. Used as a decorator, each call gets a fresh block.
    """

    def __init__(self, switches: CastSwitches) -> None:
        self._switches = switches
        self._thread: Optional[threading.Thread] = None

    def _recreate_cm(self) -> "CastsOffBlock":
        return CastsOffBlock(self._switches)

    def __enter__(self) -> None:
        if self._thread is not None:
            raise RuntimeError(
                f"this casts-off block is already entered (by thread {self._thread.name!r}); "
                "use a new block for each `with` (e.g. call amp.disable_casts() again)."
            )
        self._thread = threading.current_thread()
        self._switches.push_disabled()

    def __exit__(self, *exc_info: Any) -> bool:
        here = threading.current_thread()
        if self._thread is None:
            raise RuntimeError("this casts-off block is left without having been entered.")
        if self._thread is not here:
            raise RuntimeError(
                f"a casts-off block (amp.disable_casts()) was left on another thread ({here.name!r}) than the "
                f"thread that entered it ({self._thread.name!r}). Casts-off blocks are per thread: nothing "
                "changed; leave the block on the thread that entered it."
            )
        self._switches.pop_disabled()
        self._thread = None
        return False


class CastState(CastSwitches):
    """O1 switches of one session: process-wide options plus per-thread "casts off" blocks."""

    def __init__(self, low_dtype: torch.dtype, cache: Any, log_casts: bool = False,
                 allow_banned: bool = False, use_cache: bool = True) -> None:
        self._set_options(low_dtype, cache, log_casts, allow_banned, use_cache)
        self.thread = _ThreadSwitches()

    @property
    def enabled(self) -> bool:
        """True when casts apply to calls made by the current thread."""
        return self.active and not self.thread.disabled_depth

    def push_disabled(self) -> None:
        self.thread.disabled_depth += 1

    def pop_disabled(self) -> None:
        depth = self.thread.disabled_depth
        if depth <= 0:
            raise RuntimeError(UNMATCHED_POP_MESSAGE)
        self.thread.disabled_depth = depth - 1
