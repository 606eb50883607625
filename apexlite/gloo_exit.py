"""Letting gloo's worker threads finish while the interpreter can still serve them, at the end of a run.

A gloo worker thread can still hold a finished collective's tensors when the script ends. If it lets them
go after interpreter shutdown has begun, taking the GIL ends the thread inside a C++ destructor and the
process aborts ("terminate called without an active exception", signal 6) though the script succeeded.
With torch 2.13 on CPU, two ranks of a script that never destroys its group aborted in 5 of 30 runs under
plain `python` and 18 of 60 under `apexlite run` before this module (0 of 60 with it; docs/distributed.md).
From an exit handler (the interpreter still whole) this module destroys the group the script left, which
joins its threads when nothing else holds it, and otherwise gives them the GIL for a moment: torch keeps a
group alive for good once DDP imported torch.distributed.nn after it was made (the functions there take
it as their default), so no join.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import sys
import time
from typing import Iterator

from apexlite._logging import get_logger

log = get_logger("gloo_exit")

GIL_RELEASE_S = 0.02  # long enough for a runnable worker thread to be scheduled and take the GIL


class GlooRelease:
    """Armed once a script ends normally; at interpreter exit, destroys a default gloo group still alive.

    It is registered before the script runs, so the script's own exit handlers (registered later) run
    first and may still use the group. A script that failed is left as it was: its peers may be gone, and
    destroying a group with work still queued would wait for that work.
    """

    def __init__(self) -> None:
        self.armed = False

    def register(self) -> "GlooRelease":
        atexit.register(self.release)
        return self

    def arm(self) -> None:
        self.armed = True

    @classmethod
    @contextlib.contextmanager
    def around_script(cls) -> Iterator["GlooRelease"]:
        """Register before the script; arm when it returns or calls `sys.exit()` / `sys.exit(0)`."""
        release = cls().register()
        try:
            yield release
        except SystemExit as error:
            if error.code is None or error.code == 0:
                release.arm()
            raise
        release.arm()

    def release(self) -> bool:
        """Destroy the default group if it is gloo's and still initialised; True when it did.

        Garbage is collected either way (a DDP reducer sits in reference cycles with its module and holds
        its group), and the GIL is let go for a moment whenever torch.distributed was used.
        """
        dist = sys.modules.get("torch.distributed")
        if not self.armed or dist is None or not dist.is_available():
            return False
        gc.collect()
        destroyed = dist.is_initialized() and dist.get_backend() == "gloo"
        if destroyed:
            dist.destroy_process_group()
            gc.collect()
            log.debug("destroyed the default gloo process group the script left behind")
        time.sleep(GIL_RELEASE_S)
        return destroyed
