"""`migrate --verify`: run the original under `python -m apexlite run` and the migrated script under plain
python, N optimizer steps each, and compare their loss curves; when they differ, say whether the loss
scaling or the arithmetic differs (apexlite.migrate.scaling).

The original runs exactly as a sweep runs it (apexlite.sweep.process.run_one: the step budget
APEXLITE_MAX_STEPS and the loss curve, loss scales and skipped steps of apexlite's telemetry, at the opt
level migrate used). The migrated script runs through verify_child.py, which records the same from
torch.amp.GradScaler and backward passes, counts steps with torch's global optimizer step hook, and makes
apex (and apexlite, unless the script keeps O2's amp) unimportable. Scripts without amp.initialize have
no telemetry, so their original runs through verify_child.py too, under `apexlite run`. Both processes
are run by apexlite.child_process (time limit, whole process tree ended).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, TextIO, Tuple

from apexlite.amp.environment import LOSS_SCALE_ENV, OPT_LEVEL_ENV
from apexlite.amp.layer_precision import LAYER_DTYPES_ENV
from apexlite.amp.telemetry import DEFAULT_WARMUP_STEPS, MAX_STEPS_ENV, TELEMETRY_ENV
from apexlite.child_process import OK, run_child
from apexlite.migrate import scaling, written_files
from apexlite.migrate.compare import AGREE, Comparison, compare
from apexlite.migrate.engine import MigrationResult
from apexlite.migrate.recipes import AUTOCAST
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.precision import check_precision
from apexlite.sweep.process import run_one

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "verify_child.py")


@dataclass
class Run:
    """One side of a verification."""

    label: str
    status: str  # ok / failed / timeout
    error: Optional[str]
    curve: List[List[Any]]
    steps: int
    refused_imports: List[str] = field(default_factory=list)
    skipped_at: List[int] = field(default_factory=list)
    scale_curve: List[List[Any]] = field(default_factory=list)
    layers: Dict[str, Dict[str, int]] = field(default_factory=dict)  # apexlite.amp.layer_precision's counts

    @property
    def scaling(self) -> scaling.Scaling:
        return scaling.scaling_of(self.skipped_at, self.scale_curve)


@dataclass
class VerifyJob:
    """What both runs need: the script, its arguments, the migration, the budget and time limit."""

    script: str
    result: MigrationResult
    script_args: List[str]
    max_steps: int
    timeout: float
    tmp: str
    written: written_files.WrittenFiles

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.script))


def _run(label: str, status: str, error: Optional[str], report: Optional[Dict[str, Any]], layers: str) -> Run:
    report = report or {}
    return Run(label, status, error, report.get("loss_curve") or [], report.get("steps") or 0,
               report.get("refused_imports") or [], report.get("skipped_at") or [],
               report.get("loss_scale_curve") or [], _read_json(layers) or {})


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def _layers_file(job: "VerifyJob", side: str) -> str:
    """Where a run's layer dtypes go (a run again under a static scale replaces the file)."""
    path = os.path.join(job.tmp, f"{side}.layers.json")
    if os.path.exists(path):
        os.unlink(path)
    return path


def _run_child(command: List[str], telemetry: str, timeout: float, label: str, env: Dict[str, str],
               layers: str) -> Run:
    outcome = run_child(command, timeout, env)
    return _run(label, outcome.status, outcome.error, _read_json(telemetry), layers)


def _child_command(script: str, telemetry: Optional[str], max_steps: int, allow: List[str], path0: str,
                   script_args: List[str], under_apexlite: bool, static_scale: Optional[float]) -> List[str]:
    """verify_child.py's command line; without `telemetry` it only refuses imports (apexlite records)."""
    prefix = [sys.executable, "-m", "apexlite", "run"] if under_apexlite else [sys.executable]
    flags = [f"--allow={root}" for root in allow]
    recording = ["--telemetry", telemetry, "--max-steps", str(max_steps)] if telemetry else ["--no-record"]
    if telemetry and static_scale is not None:
        recording += ["--static-scale", repr(static_scale)]
    return [*prefix, CHILD, *recording, f"--path0={path0}", *flags, script, *script_args]


def _static_env(static_scale: Optional[float]) -> Dict[str, str]:
    return {} if static_scale is None else {LOSS_SCALE_ENV: repr(static_scale)}


def run_original(job: VerifyJob, static_scale: Optional[float] = None) -> Run:
    setup = job.result.setup
    suffix = "" if static_scale is None else f", static loss scale {static_scale:g}"
    layers = _layers_file(job, "original")
    counting = {LAYER_DTYPES_ENV: layers}
    if setup is not None:
        dtype = "bfloat16" if setup.recipe == AUTOCAST and setup.level == "O2" else "float32"  # float32: the script's
        record = run_one(job.script, job.script_args, setup.level, dtype, job.timeout, job.max_steps,
                         DEFAULT_WARMUP_STEPS, {**_static_env(static_scale), **counting})
        if not _skipped_amp(record):
            return _run(f"original (apexlite run, {setup.level}{suffix})", record["status"], record.get("error"),
                        record.get("telemetry"), layers)
        layers = _layers_file(job, "original")
        counting = {LAYER_DTYPES_ENV: layers}
        # a flag kept amp off on this run (`if args.fp16: amp.initialize(...)`): measured as a script without amp
    telemetry = os.path.join(job.tmp, "original.json")
    command = _child_command(job.script, telemetry, job.max_steps, ["apex", "amp_C", "apexlite"], job.directory,
                             job.script_args, under_apexlite=True, static_scale=static_scale)
    env = {**os.environ, **_static_env(static_scale), **counting}
    return _run_child(command, telemetry, job.timeout, f"original (apexlite run{suffix})", env, layers)


def _skipped_amp(record: Dict[str, Any]) -> bool:
    """Whether the script ran to its end without calling amp.initialize (so run_one recorded nothing)."""
    return record["exit_code"] == 0 and record.get("telemetry") is None


def run_migrated(job: VerifyJob, migrated: str, static_scale: Optional[float] = None) -> Run:
    result = job.result
    telemetry = os.path.join(job.tmp, "migrated.json")
    layers = _layers_file(job, "migrated")
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env[LAYER_DTYPES_ENV] = layers
    if result.needs_apexlite:  # amp kept on apexlite: its own telemetry and step budget, as for the original
        env.update({TELEMETRY_ENV: telemetry, MAX_STEPS_ENV: str(job.max_steps), OPT_LEVEL_ENV: result.setup.level,
                    **_static_env(static_scale)})
    command = _child_command(migrated, None if result.needs_apexlite else telemetry, job.max_steps,
                             ["apexlite"] if result.needs_apexlite else [], job.directory, job.script_args,
                             under_apexlite=False, static_scale=static_scale)
    label = "migrated (python, apex not importable" + ("" if result.needs_apexlite else ", nor apexlite")
    label += ")" if static_scale is None else f", static loss scale {static_scale:g})"
    return _run_child(command, telemetry, job.timeout, label, env, layers)


def _describe(run: Run) -> str:
    losses = [value for _, value in run.curve]
    first = f"{losses[0]:.4g}" if losses and losses[0] is not None else "-"
    last = f"{losses[-1]:.4g}" if losses and losses[-1] is not None else "-"
    skipped = f", skipped {scaling.steps_text(run.skipped_at)}" if run.skipped_at else ""
    text = f"{run.label}: {run.status}, {run.steps} steps{skipped}, {len(losses)} losses (first {first}, last {last})"
    return text + (f"; {run.error}" if run.error else "")


@contextlib.contextmanager
def _restoring(written: written_files.WrittenFiles) -> Iterator[None]:
    try:
        yield
    finally:
        written.restore()


@contextlib.contextmanager
def _migrated_file(job: VerifyJob, migrated_path: Optional[str]) -> Iterator[str]:
    """The migrated script on disk: `migrated_path`, else a temporary file next to the original (same
    sys.path[0] and __file__ directory), removed afterwards."""
    if migrated_path is not None:
        yield migrated_path
        return
    handle, path = tempfile.mkstemp(prefix=".apexlite-migrated-", suffix=".py", dir=job.directory)
    try:
        with os.fdopen(handle, "wb") as written:
            written.write(job.result.migrated)
        yield path
    finally:
        os.unlink(path)


def _both(job: VerifyJob, path: str, out: TextIO, static_scale: Optional[float] = None) -> Optional[Tuple[Run, Run]]:
    """The original, then the migrated run, each starting from the files that were there before the
    verification (what an earlier run created, a checkpoint say, is held aside: written_files)."""
    notes, runs = [], []
    for label, start in (("original", lambda: run_original(job, static_scale)),
                         ("migrated", lambda: run_migrated(job, path, static_scale))):
        job.written.before_run()
        runs.append(start())
        notes += job.written.after_run(label, later_run=label == "original")
    original, migrated = runs
    out.write(f"verify: {_describe(original)}\n")
    out.write(f"verify: {_describe(migrated)}\n")
    out.writelines(f"verify: note: {note}\n" for note in notes)
    if original.status != OK or migrated.status != OK:
        out.write("verify: FAILED: a run did not finish\n")
        return None
    return original, migrated


def verify_migration(script: str, result: MigrationResult, script_args: List[str], max_steps: int,
                     timeout: float, tolerance: float, options: MigrateOptions, migrated_path: Optional[str],
                     out: TextIO) -> int:
    """Run both, print the comparison (and, when they differ, which kind of difference), return 0 when
    they agree and 1 otherwise."""
    if result.exit_status != 0:
        out.write("verify: skipped: the migration left TODOs or failed; finish it first\n")
        return 1
    with tempfile.TemporaryDirectory(prefix="apexlite-verify-") as tmp:
        job = VerifyJob(script, result, script_args, max_steps, timeout, tmp,
                        written_files.WrittenFiles([os.getcwd(), os.path.dirname(os.path.abspath(script))]))
        if not job.written.complete:
            out.write(f"verify: note: over {written_files.MAX_FILES:,} files under {' and '.join(job.written.roots)}: "
                      "the files each run writes are not watched, so a run may read what an earlier one wrote\n")
        with _migrated_file(job, migrated_path) as path, _restoring(job.written):
            runs = _both(job, path, out)
            if runs is None:
                return 1
            original, migrated = runs
            blocked = ", ".join(sorted(set(migrated.refused_imports)))
            out.write("verify: apex imports refused in the migrated run: " + (blocked or "none attempted") + "\n")
            comparison = compare(original.curve, migrated.curve, tolerance)
            precision = check_precision(original.layers, migrated.layers)
            out.writelines(line + "\n" for line in precision.lines)
            if comparison.verdict == AGREE and precision.lost is not None:
                out.write(format_comparison(comparison) + "\n")
                out.write(f"verify: verdict: DIFFER (precision): the losses agree, but {precision.lost}\n")
                return 1
            if comparison.verdict == AGREE:
                out.write(format_comparison(comparison, verdict="AGREE") + "\n")
                _note_scaling(original, migrated, out)
                return 0
            out.write(format_comparison(comparison) + "\n")
            _diagnose(job, path, original, migrated, comparison, tolerance, out)
            if precision.lost is not None:
                out.write(f"verify: besides, {precision.lost}\n")
            return 1


def _note_scaling(original: Run, migrated: Run, out: TextIO) -> None:
    """Agreeing curves whose loss scaling differed: worth knowing (a longer run may part)."""
    before, after = original.scaling, migrated.scaling
    if scaling.scaling_differs(before, after):
        out.write("verify: note: the loss scaling differed ("
                  f"{scaling.describe_difference(before, after, [step for step, _ in original.curve])}), "
                  "yet the losses agree\n")


def _diagnose(job: VerifyJob, path: str, original: Run, migrated: Run, comparison: Comparison, tolerance: float,
              out: TextIO) -> None:
    """Loss scaling or arithmetic: the final verdict line."""
    before, after = original.scaling, migrated.scaling
    if not scaling.scaling_differs(before, after):
        out.write(f"verify: verdict: DIFFER (arithmetic): {comparison.reason}, with the same loss scaling in both "
                  f"runs (skipped steps {scaling.steps_text(before.skipped)}, every loss scaled alike)\n")
        return
    difference = scaling.describe_difference(before, after, [step for step, _ in original.curve])
    static_scale = scaling.static_scale_for(before, after)
    out.write(f"verify: the loss scaling differs ({difference}); running both again under one static loss scale "
              f"{static_scale:g}\n")
    runs = _both(job, path, out, static_scale)
    if runs is None:
        return
    static = compare(runs[0].curve, runs[1].curve, tolerance)
    out.write(format_comparison(static, prefix=f"under one static loss scale {static_scale:g}: ") + "\n")
    if static.verdict == AGREE:
        out.write(f"verify: verdict: DIFFER (loss scaling): the curves differ because the loss scaling differs "
                  f"({difference}); under one static loss scale {static_scale:g} they agree within "
                  f"{static.largest:.3%} (tolerance {tolerance:.3%}), so the arithmetic is the same: the original "
                  "scales each loss on its own (num_losses, one scaler per loss_id, as apex did), the migrated script "
                  "has one torch.amp.GradScaler per optimizer (torch's recipe), so they overflow and skip steps at "
                  "different times\n")
    else:
        out.write(f"verify: verdict: DIFFER (arithmetic): under one static loss scale {static_scale:g} the runs still "
                  f"differ: {static.reason}; the migrated script computes something else\n")


def format_comparison(comparison: Comparison, prefix: str = "", verdict: Optional[str] = None) -> str:
    """`verify: [prefix]N losses compared; largest relative difference X (loss i, step s); [verdict: V: ]reason`."""
    where = f" (loss {comparison.at_index + 1}, step {comparison.at_step})" if comparison.at_index is not None else ""
    said = f"verdict: {verdict}: " if verdict is not None else ""
    return (f"verify: {prefix}{comparison.points} losses compared; largest relative difference "
            f"{comparison.largest:.3%}{where}; {said}{comparison.reason}")
