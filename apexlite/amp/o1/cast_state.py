"""CastState: the switches every O1 wrapper of a session reads on each call.

NOTE [cast switches are per thread]
`active` says whether the session wants O1 casts at all (set by `initialize`/`amp.init`, the same in
every thread). Turning casts off for a block (`amp.disable_casts()`, the optimizer step's internal
switch, a handle's `_disable_casts()`) is a per-thread depth counter, as torch.autocast's state is
thread-local: a block in one thread never changes what another thread computes, overlapping blocks
in two threads each restore exactly, and a new thread starts with casts on.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch


class _ThreadSwitches(threading.local):
    """Per-thread state; the class attributes are the defaults every new thread starts from."""

    disabled_depth = 0  # > 0 while this thread is inside a casts-off block


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

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Casts off for the current thread inside the block (nesting-safe, exception-safe)."""
        self.push_disabled()
        try:
            yield
        finally:
            self.pop_disabled()


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
        self.thread.disabled_depth -= 1
