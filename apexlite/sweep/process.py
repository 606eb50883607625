"""The environment a measured run gets, and one such run start to end (what `migrate --verify` uses; the
sweep itself paces its runs through apexlite.sweep.children).

The process itself is run by apexlite.child_process (own process group, time limit, the whole tree
ended afterwards, output to files); this module adds the environment and reads the telemetry.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional

from apexlite.amp.environment import DTYPE_ENV, OPT_LEVEL_ENV
from apexlite.amp.telemetry import DEFAULT_WARMUP_STEPS, MAX_STEPS_ENV, TELEMETRY_ENV, WARMUP_ENV
from apexlite.child_process import OK, run_child


def sweep_environment(level: str, dtype: str, telemetry: str, max_steps: Optional[int],
                      warmup: int = DEFAULT_WARMUP_STEPS, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This process's environment with the variables that pick the opt level, dtype, budget and report file."""
    env = dict(os.environ)
    for name in (DTYPE_ENV, MAX_STEPS_ENV):
        env.pop(name, None)
    env.update({OPT_LEVEL_ENV: level, TELEMETRY_ENV: telemetry, WARMUP_ENV: str(warmup)})
    if dtype != "float32":
        env[DTYPE_ENV] = dtype
    if max_steps is not None:
        env[MAX_STEPS_ENV] = str(max_steps)
    env.update(extra or {})
    return env


def run_one(script: str, script_args: List[str], level: str, dtype: str, timeout: float,
            max_steps: Optional[int] = None, warmup: int = DEFAULT_WARMUP_STEPS,
            extra_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run one combination; returns its record: status ok / failed / timeout, error, telemetry fields.
    `extra_env` adds variables to the child's environment (migrate --verify's static loss scale)."""
    record: Dict[str, Any] = {"opt_level": level, "dtype": dtype, "status": OK, "error": None,
                              "exit_code": None, "telemetry": None}
    with tempfile.TemporaryDirectory(prefix="apexlite-sweep-") as tmp:
        telemetry = os.path.join(tmp, "telemetry.json")
        command = [sys.executable, "-m", "apexlite", "run", script, *script_args]
        outcome = run_child(command, timeout, sweep_environment(level, dtype, telemetry, max_steps, warmup, extra_env))
        record.update(status=outcome.status, error=outcome.error, exit_code=outcome.exit_code,
                      wall_time_s=outcome.wall_time_s)
        if os.path.exists(telemetry):
            with open(telemetry) as handle:
                record["telemetry"] = json.load(handle)
        if record["status"] == OK and record["telemetry"] is None:
            record.update(status="failed", error="the script never called amp.initialize, so nothing was measured")
    return record
