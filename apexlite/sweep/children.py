"""The sweep's side of one combination's run: a `python -m apexlite run` process it paces through a gate.

The process starts and pauses after its warm-up (apexlite.sweep.gate), and stays paused while the others
start; the sweep then asks it for slices of timed steps, one child at a time, and finally lets it run on
to its end. Its
time limit counts only the time it was running (start-up, its slices, the run to its end), never the
time it sat paused while the others ran. Like apexlite.child_process: its own session, output to files,
the whole group ended afterwards, and a killed run keeps the telemetry it wrote on SIGTERM.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from apexlite.child_process import FAILED, OK, TIMEOUT, end_process_group, exception_line
from apexlite.sweep.gate import GATE_ENV
from apexlite.sweep.process import sweep_environment

POLL_S = 0.2  # how often a wait looks whether the child ended without reporting (a forked worker may hold
# the pipe open, so its end is not always seen on the pipe)


@dataclass
class Slice:
    """One slice's timed steps: each step's time and how long the run's threads waited for a CPU during
    it (seconds; None where the platform does not say)."""

    wall: List[float]
    waited: List[Optional[float]]


class PacedChild:
    """One combination's run: started paused-at-warm-up, asked for slices, then let go."""

    def __init__(self, script: str, script_args: List[str], level: str, dtype: str, timeout: float,
                 max_steps: Optional[int], warmup: int) -> None:
        self.level, self.dtype, self.timeout = level, dtype, timeout
        self.folder = tempfile.mkdtemp(prefix="apexlite-sweep-")
        self.telemetry_path = os.path.join(self.folder, "telemetry.json")
        self.stderr_path = os.path.join(self.folder, "stderr.txt")
        self.running_s = 0.0  # time spent running (not paused): what the time limit counts
        self.status: Optional[str] = None  # set once the run is over: ok / failed / timeout
        self.error: Optional[str] = None
        self.exit_code: Optional[int] = None
        self.paced = False  # True once the child paused at its warm-up (its gate works)
        commands_read, self._commands = os.pipe()
        self._reports, reports_write = os.pipe()
        env = sweep_environment(level, dtype, self.telemetry_path, max_steps, warmup)
        env[GATE_ENV] = f"{os.getpid()}:{commands_read}:{reports_write}"
        with open(os.devnull, "w") as stdout, open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "apexlite", "run", script, *script_args], env=env,
                                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                            start_new_session=True, pass_fds=(commands_read, reports_write))
        os.close(commands_read)
        os.close(reports_write)
        self._buffer = b""
        self._closed = False  # the child closed its end of the report pipe

    @property
    def finished(self) -> bool:
        return self.status is not None

    def wait_until_warm(self) -> bool:
        """Wait for the pause after warm-up (True), or for the run to end first (False: it never paused)."""
        report = self._next_report()
        self.paced = report is not None
        return self.paced

    def run_slice(self, steps: int) -> Optional[Slice]:
        """Run `steps` timed steps and return their times; None when the run ended (or timed out) instead."""
        self._send(str(steps))
        report = self._next_report()
        return None if report is None else Slice(report.get("wall", []), report.get("waited", []))

    def release(self) -> None:
        """Let the run go on to its end without pausing, and wait for that end (within the time limit)."""
        self._send("0")
        while not self.finished:
            self._next_report()

    def _send(self, command: str) -> None:
        if self.finished:
            return
        try:
            os.write(self._commands, (command + "\n").encode())
        except OSError:  # the child is gone; the next wait sees how it ended
            pass

    def _next_report(self) -> Optional[Dict[str, Any]]:
        """The child's next report line, waiting while it runs; None once it has ended."""
        while not self.finished:
            line = self._take_line()
            if line is not None:
                return json.loads(line)
            left = self.timeout - self.running_s
            if left <= 0:
                self._end(None)
                break
            began = time.perf_counter()
            code = self._wait_for_output(left)
            self.running_s += time.perf_counter() - began
            if code is not None and b"\n" not in self._buffer:
                self._end(code)
        return None

    def _wait_for_output(self, left: float) -> Optional[int]:
        """Wait up to `left` seconds for the next bytes or for the child's end; its exit code once it ended."""
        if self._closed:  # the gate let go of its pipe (released): only the end is left to wait for
            try:
                return self.process.wait(timeout=left)
            except subprocess.TimeoutExpired:
                return None
        ready, _, _ = select.select([self._reports], [], [], min(POLL_S, left))
        if ready:
            chunk = os.read(self._reports, 65536)
            self._buffer += chunk
            self._closed = not chunk
        return self.process.poll()

    def _take_line(self) -> Optional[bytes]:
        if b"\n" not in self._buffer:
            return None
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _end(self, code: Optional[int]) -> None:
        """Record how the run ended (None: it ran out of time) and end its whole process group."""
        end_process_group(self.process)
        self.exit_code = code
        if code is None:
            self.status = TIMEOUT
            self.error = f"did not finish within {self.timeout:g}s of running; killed with its child processes"
        elif code != 0:
            with open(self.stderr_path, errors="replace") as handle:
                message = exception_line(handle.read())
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            self.status, self.error = FAILED, f"{how}: {message}"
        else:
            self.status = OK
        for descriptor in (self._commands, self._reports):
            try:
                os.close(descriptor)
            except OSError:
                pass

    def record(self) -> Dict[str, Any]:
        """The run's record as sweep.verdict reads it (status, error, exit code, wall time, telemetry)."""
        telemetry = None
        if os.path.exists(self.telemetry_path):
            with open(self.telemetry_path) as handle:
                telemetry = json.load(handle)
        record: Dict[str, Any] = {"opt_level": self.level, "dtype": self.dtype, "status": self.status,
                                  "error": self.error, "exit_code": self.exit_code,
                                  "wall_time_s": round(self.running_s, 3), "telemetry": telemetry}
        if self.status == OK and telemetry is None:
            record.update(status=FAILED, error="the script never called amp.initialize, so nothing was measured")
        elif self.status == OK and not telemetry.get("steps"):
            why = ("it called amp.initialize(..., enabled=False), so amp was off: pass the script's own switch that "
                   "turns amp on after `--`" if telemetry.get("amp_enabled") is False
                   else "no step() of an optimizer amp manages ran")
            record.update(status=FAILED, error=f"the script ended without one amp optimizer step ({why}), so nothing "
                                               "was measured")
        return record

    def discard(self) -> None:
        """End the process group if still running and remove the run's files."""
        if not self.finished:
            self._end(None)
        shutil.rmtree(self.folder, ignore_errors=True)
