"""Running one child process with a time limit, and ending it together with every process it started.

`sweep` runs each combination this way and `migrate --verify` runs the original and the migrated script
this way. The child gets its own session (process group), so a timeout ends it with its whole tree;
its output goes to files, not pipes, so a grandchild holding a pipe open can never keep the parent
waiting. Ending a group is SIGTERM first (scripts and apexlite's telemetry write their reports on it),
then SIGKILL to whatever is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

TERMINATE_GRACE_S = 3.0  # between SIGTERM (the child writes its telemetry) and SIGKILL
TRACEBACK_HEADER = "Traceback (most recent call last):"
OK, FAILED, TIMEOUT = "ok", "failed", "timeout"


@dataclass
class ChildOutcome:
    """How a child ended: status ok / failed / timeout, its exit code (None after a timeout), a one-line
    error for the ones that did not end well, and the wall time it ran."""

    status: str
    exit_code: Optional[int]
    error: Optional[str]
    wall_time_s: float


def exception_line(stderr: str) -> str:
    """The final exception's `Type: message` line of a traceback, else the last line of stderr.

    Whatever else the child printed (warnings at import, profiler notes) is skipped.
    """
    lines = stderr.splitlines()
    headers = [index for index, line in enumerate(lines) if line.startswith(TRACEBACK_HEADER)]
    if headers:
        for line in lines[headers[-1] + 1:]:
            if line.strip() and not line[0].isspace():
                return line.strip()
    text = [line.strip() for line in lines if line.strip()]
    return text[-1] if text else "no error output"


def end_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the child's whole group, then SIGKILL to whatever is left of it."""
    for sig, wait_s in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if sig is signal.SIGTERM:  # the child is gone; its children may not be
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break


def _failure(code: int, stderr_path: str) -> str:
    with open(stderr_path, errors="replace") as handle:
        message = exception_line(handle.read())
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return f"{how}: {message}"


def run_child(command: List[str], timeout: float, env: Optional[Dict[str, str]] = None) -> ChildOutcome:
    """Run `command` (stdin and stdout closed to it, stderr kept for the error line) for at most `timeout`
    seconds; the whole process group is ended afterwards, whether it finished or not."""
    with tempfile.TemporaryDirectory(prefix="apexlite-child-") as tmp:
        stderr_path = os.path.join(tmp, "stderr.txt")
        start = time.perf_counter()
        with open(os.devnull, "w") as stdout, open(stderr_path, "w") as stderr:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                       start_new_session=True)
            try:
                code: Optional[int] = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                end_process_group(process)  # also reaps children left behind by a run that finished
        wall = round(time.perf_counter() - start, 3)
        if code is None:
            return ChildOutcome(TIMEOUT, None, f"did not finish within {timeout:g}s; killed with its child processes",
                                wall)
        if code != 0:
            return ChildOutcome(FAILED, code, _failure(code, stderr_path), wall)
        return ChildOutcome(OK, 0, None, wall)
