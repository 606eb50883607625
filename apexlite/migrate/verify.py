"""`migrate --verify`: run the original under `python -m apexlite run` and the migrated script under plain
python, N optimizer steps each, and compare their loss curves.

The original runs exactly as a sweep runs it (apexlite.sweep.process.run_one: the step budget
APEXLITE_MAX_STEPS and the loss curve of apexlite's telemetry, at the opt level migrate used). The
migrated script runs through verify_child.py, which records the same curve from torch.amp.GradScaler
and backward passes, counts steps with torch's global optimizer step hook, and makes apex (and apexlite,
unless the script keeps O2's amp) unimportable. Scripts without amp.initialize have no telemetry, so
their original runs through verify_child.py too, under `apexlite run`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, TextIO

from apexlite.amp.frontend import OPT_LEVEL_ENV
from apexlite.amp.telemetry import DEFAULT_WARMUP_STEPS, MAX_STEPS_ENV, TELEMETRY_ENV
from apexlite.migrate.compare import AGREE, Comparison, compare
from apexlite.migrate.engine import MigrationResult
from apexlite.migrate.initialize import AUTOCAST
from apexlite.migrate.options import MigrateOptions
from apexlite.sweep.process import _end_process_group, exception_line, run_one

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verify_child.py")


@dataclass
class Run:
    """One side of a verification."""

    label: str
    status: str  # ok / failed / timeout
    error: Optional[str]
    curve: List[List[Any]]
    steps: int
    refused_imports: List[str]


def _from_sweep(record: Dict[str, Any], label: str) -> Run:
    telemetry = record.get("telemetry") or {}
    return Run(label, record["status"], record.get("error"), telemetry.get("loss_curve") or [],
               telemetry.get("steps") or 0, [])


def _run_child(command: List[str], telemetry: str, timeout: float, label: str,
               env: Optional[Dict[str, str]] = None) -> Run:
    with tempfile.TemporaryDirectory(prefix="apexlite-verify-") as tmp:
        stderr_path = os.path.join(tmp, "stderr.txt")
        with open(os.devnull, "w") as stdout, open(stderr_path, "w") as stderr:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                                       start_new_session=True)
            status, error = "ok", None
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code, status, error = None, "timeout", f"did not finish within {timeout:g}s; killed"
            finally:
                _end_process_group(process)
        if status == "ok" and code != 0:
            with open(stderr_path, errors="replace") as handle:
                message = exception_line(handle.read())
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            status, error = "failed", f"{how}: {message}"
    report: Dict[str, Any] = {}
    if os.path.exists(telemetry):
        with open(telemetry) as handle:
            report = json.load(handle)
    return Run(label, status, error, report.get("loss_curve") or [], report.get("steps") or 0,
               report.get("refused_imports") or [])


def _child_command(script: str, telemetry: Optional[str], max_steps: int, allow: List[str], path0: str,
                   script_args: List[str], under_apexlite: bool) -> List[str]:
    """verify_child.py's command line; without `telemetry` it only refuses imports (apexlite records)."""
    prefix = [sys.executable, "-m", "apexlite", "run"] if under_apexlite else [sys.executable]
    flags = [f"--allow={root}" for root in allow]
    recording = ["--telemetry", telemetry, "--max-steps", str(max_steps)] if telemetry else ["--no-record"]
    return [*prefix, CHILD, *recording, f"--path0={path0}", *flags, script, *script_args]


def run_original(script: str, result: MigrationResult, script_args: List[str], max_steps: int,
                 timeout: float, tmp: str) -> Run:
    setup = result.setup
    if setup is not None:
        dtype = "bfloat16" if setup.recipe == AUTOCAST and setup.level == "O2" else "float32"  # float32: the script's
        record = run_one(script, script_args, setup.level, dtype, timeout, max_steps, DEFAULT_WARMUP_STEPS)
        return _from_sweep(record, f"original (apexlite run, {setup.level})")
    telemetry = os.path.join(tmp, "original.json")
    command = _child_command(script, telemetry, max_steps, ["apex", "amp_C", "apexlite"],
                             os.path.dirname(os.path.abspath(script)), script_args, under_apexlite=True)
    return _run_child(command, telemetry, timeout, "original (apexlite run)")


def run_migrated(migrated: str, script: str, result: MigrationResult, script_args: List[str], max_steps: int,
                 timeout: float, tmp: str) -> Run:
    telemetry = os.path.join(tmp, "migrated.json")
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    if result.needs_apexlite:  # amp kept on apexlite: its own telemetry and step budget, as for the original
        env.update({TELEMETRY_ENV: telemetry, MAX_STEPS_ENV: str(max_steps), OPT_LEVEL_ENV: result.setup.level})
    command = _child_command(migrated, None if result.needs_apexlite else telemetry, max_steps,
                             ["apexlite"] if result.needs_apexlite else [],
                             os.path.dirname(os.path.abspath(script)), script_args, under_apexlite=False)
    label = "migrated (python, apex not importable" + ("" if result.needs_apexlite else ", nor apexlite") + ")"
    return _run_child(command, telemetry, timeout, label, env)


def _describe(run: Run) -> str:
    losses = [value for _, value in run.curve]
    first = f"{losses[0]:.4g}" if losses and losses[0] is not None else "-"
    last = f"{losses[-1]:.4g}" if losses and losses[-1] is not None else "-"
    text = f"{run.label}: {run.status}, {run.steps} steps, {len(losses)} losses (first {first}, last {last})"
    return text + (f"; {run.error}" if run.error else "")


def verify_migration(script: str, result: MigrationResult, script_args: List[str], max_steps: int,
                     timeout: float, tolerance: float, options: MigrateOptions, migrated_path: Optional[str],
                     out: TextIO) -> int:
    """Run both, print the comparison, return 0 when they agree and 1 otherwise."""
    if result.exit_status != 0:
        out.write("verify: skipped: the migration left TODOs or failed; finish it first\n")
        return 1
    directory = os.path.dirname(os.path.abspath(script))
    with tempfile.TemporaryDirectory(prefix="apexlite-verify-") as tmp:
        path = migrated_path
        if path is None:  # next to the original: same sys.path[0] and __file__ directory
            handle, path = tempfile.mkstemp(prefix=".apexlite-migrated-", suffix=".py", dir=directory)
            with os.fdopen(handle, "wb") as written:
                written.write(result.migrated)
        try:
            start = time.perf_counter()
            original = run_original(script, result, script_args, max_steps, timeout, tmp)
            migrated = run_migrated(path, script, result, script_args, max_steps, timeout, tmp)
            elapsed = time.perf_counter() - start
        finally:
            if migrated_path is None:
                os.unlink(path)
    out.write(f"verify: {_describe(original)}\n")
    out.write(f"verify: {_describe(migrated)}\n")
    blocked = ", ".join(sorted(set(migrated.refused_imports)))
    out.write("verify: apex imports refused in the migrated run: " + (blocked or "none attempted") + "\n")
    if original.status != "ok" or migrated.status != "ok":
        out.write(f"verify: FAILED: a run did not finish ({elapsed:.1f}s)\n")
        return 1
    comparison = compare(original.curve, migrated.curve, tolerance)
    out.write(format_comparison(comparison) + "\n")
    return 0 if comparison.verdict == AGREE else 1


def format_comparison(comparison: Comparison) -> str:
    where = f" (loss {comparison.at_index + 1}, step {comparison.at_step})" if comparison.at_index is not None else ""
    return (f"verify: {comparison.points} losses compared; largest relative difference "
            f"{comparison.largest:.3%}{where}; verdict: {comparison.verdict.upper()}: {comparison.reason}")
