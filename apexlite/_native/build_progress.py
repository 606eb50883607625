"""Progress lines while a kernel build runs: how many of its steps are done, and for how long it has run.

Standard library only (setup.py uses it). A build's steps are one compile per source, then the link.
A compile is done when its object file (``*.o``, anywhere under the build folder) is written, which
ninja (the first-use build, and the install's when ninja is there) and setuptools' one-by-one compile
both do; so the count needs nothing from their output. A background thread looks once a second and
says a line when a step was done (at most one line per ``quiet`` seconds) or, without one, every
``heartbeat`` seconds, so a long compile is never silent.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Optional, Set

POLL_SECONDS = 1.0


class BuildProgress:
    """Says `title`'s progress through `say` while the ``with`` block runs (the build itself)."""

    def __init__(self, folder: Path, sources: int, title: str, expected: str, say: Callable[[str], None],
                 quiet: float = 10.0, heartbeat: float = 30.0) -> None:
        self.folder = folder
        self.total = sources + 1  # the link
        self.title = title
        self.expected = expected  # 'about 2 min'
        self.say = say
        self.quiet = quiet
        self.heartbeat = heartbeat
        self.started = time.time()
        self._reported = 0        # steps done at the last line
        self._last_line = time.monotonic()
        self._started_monotonic = self._last_line
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def steps_done(self) -> int:
        """Object files written since the build started (a stale one from an earlier build does not count)."""
        written: Set[str] = set()
        try:
            for path in self.folder.rglob("*.o"):
                try:
                    if path.stat().st_mtime >= self.started - 1:
                        written.add(str(path))
                except OSError:  # removed while looking
                    continue
        except OSError:  # the folder does not exist yet
            return 0
        return min(len(written), self.total - 1)

    def complete(self) -> bool:
        """Whether every source was compiled by this build (not an earlier one's objects reused): only then
        do its times measure a whole build."""
        return self.steps_done() == self.total - 1

    def line(self, done: int, elapsed: float) -> str:
        return f"{self.title}: {done} of {self.total} steps done after {elapsed:.0f} s (estimated: {self.expected})"

    def check(self, now: Optional[float] = None) -> Optional[str]:
        """One look: the line to say now, if any (the thread calls this; tests call it with their clock)."""
        now = time.monotonic() if now is None else now
        done = self.steps_done()
        since_line = now - self._last_line
        if (done > self._reported and since_line >= self.quiet) or since_line >= self.heartbeat:
            self._reported, self._last_line = done, now
            return self.line(done, now - self._started_monotonic)
        return None

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            message = self.check()
            if message:
                self.say(message)

    def __enter__(self) -> "BuildProgress":
        self._thread = threading.Thread(target=self._watch, name="apexlite-build-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
