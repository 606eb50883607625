"""One run of a sweep: a fresh `python -m apexlite run` process, its telemetry, its outcome.

The child runs in its own session (process group), so a timeout ends it together with every
process it started. Output goes to files, not pipes: a grandchild holding a pipe open can never
keep the sweep waiting.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from apexlite.amp.frontend import DTYPE_ENV, OPT_LEVEL_ENV
from apexlite.amp.telemetry import DEFAULT_WARMUP_STEPS, MAX_STEPS_ENV, TELEMETRY_ENV, WARMUP_ENV

TERMINATE_GRACE_S = 3.0  # between SIGTERM (the child writes its telemetry) and SIGKILL
TRACEBACK_HEADER = "Traceback (most recent call last):"


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


def _end_process_group(process: subprocess.Popen) -> None:
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


def _child_environment(level: str, dtype: str, telemetry: str, max_steps: Optional[int],
                       warmup: int) -> Dict[str, str]:
    env = dict(os.environ)
    for name in (DTYPE_ENV, MAX_STEPS_ENV):
        env.pop(name, None)
    env.update({OPT_LEVEL_ENV: level, TELEMETRY_ENV: telemetry, WARMUP_ENV: str(warmup)})
    if dtype != "float32":
        env[DTYPE_ENV] = dtype
    if max_steps is not None:
        env[MAX_STEPS_ENV] = str(max_steps)
    return env


def run_one(script: str, script_args: List[str], level: str, dtype: str, timeout: float,
            max_steps: Optional[int] = None, warmup: int = DEFAULT_WARMUP_STEPS) -> Dict[str, Any]:
    """Run one combination; returns its record: status ok / failed / timeout, error, telemetry fields."""
    record: Dict[str, Any] = {"opt_level": level, "dtype": dtype, "status": "ok", "error": None,
                              "exit_code": None, "telemetry": None}
    with tempfile.TemporaryDirectory(prefix="apexlite-sweep-") as tmp:
        telemetry = os.path.join(tmp, "telemetry.json")
        stderr_path = os.path.join(tmp, "stderr.txt")
        command = [sys.executable, "-m", "apexlite", "run", script, *script_args]
        env = _child_environment(level, dtype, telemetry, max_steps, warmup)
        start = time.perf_counter()
        with open(os.devnull, "w") as stdout, open(stderr_path, "w") as stderr:
            process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                       stderr=stderr, start_new_session=True)
            try:
                record["exit_code"] = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                record.update(status="timeout", error=f"did not finish within {timeout:g}s; killed with its "
                                                      "child processes")
            finally:
                _end_process_group(process)  # also reaps children left behind by a run that finished
        record["wall_time_s"] = round(time.perf_counter() - start, 3)
        if os.path.exists(telemetry):
            with open(telemetry) as handle:
                record["telemetry"] = json.load(handle)
        code = record["exit_code"]
        if record["status"] == "ok" and code != 0:
            with open(stderr_path, errors="replace") as handle:
                message = exception_line(handle.read())
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            record.update(status="failed", error=f"{how}: {message}")
        elif record["status"] == "ok" and record["telemetry"] is None:
            record.update(status="failed", error="the script never called amp.initialize, so nothing was measured")
    return record
