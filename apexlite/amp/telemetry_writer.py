"""Where a session's telemetry report goes: $APEXLITE_TELEMETRY, checked before amp changes anything, and
written for the latest session at exit and on SIGTERM (apexlite.amp.telemetry's RunStats makes it)."""
from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Any, Optional

from apexlite.amp.errors import AmpConfigError
from apexlite.amp.telemetry import TELEMETRY_ENV


def telemetry_requested() -> bool:
    """True when this process should keep samples and write a report."""
    return bool(os.environ.get(TELEMETRY_ENV))


def check_report_path() -> None:
    """$APEXLITE_TELEMETRY, if set, must be writable: the report is written beside it (a .partial file) and
    moved onto it. `initialize` checks it first, so a bad path is refused before anything changes rather than
    failing inside a training step."""
    path = os.environ.get(TELEMETRY_ENV)
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        problem = "is a folder; name a file in it"
    elif not os.path.isdir(folder):
        problem = f"is in a folder that does not exist ({folder})"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"is in a folder this process may not write ({folder})"
    else:
        return
    raise AmpConfigError(f"{TELEMETRY_ENV}={path!r} {problem}. Unset it or fix it.")


class _TelemetryWriter:
    """Writes the most recent session's report to $APEXLITE_TELEMETRY at exit and on SIGTERM."""

    latest: Optional[Any] = None
    registered = False

    @classmethod
    def track(cls, session: Any) -> None:
        path = os.environ.get(TELEMETRY_ENV)
        if not path:
            return
        session.stats.attach(session, path)
        cls.latest = session
        if not cls.registered:
            atexit.register(cls.write)
            cls._flush_on_sigterm()
            cls.registered = True

    @classmethod
    def write(cls) -> None:
        if cls.latest is not None:
            cls.latest.stats.flush()

    @classmethod
    def _flush_on_sigterm(cls) -> None:
        """A run killed with SIGTERM (a sweep's timeout) still writes its report; a script's own handler wins."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, cls._write_and_terminate)

    @classmethod
    def _write_and_terminate(cls, signum: int, frame: Any) -> None:
        try:
            cls.write()
        finally:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)


track_session = _TelemetryWriter.track
