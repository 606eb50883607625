"""`python -m apexlite sweep SCRIPT --opt-levels O0,O1,O2,O3 [--dtypes ...] [--json F] [--plot F.png] [-- ARGS]`.

Runs the script once per (opt level, dtype) in a fresh `python -m apexlite run` process, with
APEXLITE_OPT_LEVEL / APEXLITE_DTYPE selecting the combination and APEXLITE_TELEMETRY collecting what
apexlite measured in that run (steps, median step time, peak memory, first/final loss seen by
`scale_loss`, skipped steps, final loss scale, casts per iteration). A failing run is recorded with
its error and the sweep goes on. O0 does not use a low-precision dtype, so it runs once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from apexlite.amp.opt_levels import OPT_LEVELS

METRICS = ("steps", "applied_steps", "skipped_steps", "step_time_ms", "peak_memory_mb", "first_loss",
           "final_loss", "loss_scale", "casts_per_iteration", "losses")
DTYPES = ("float16", "bfloat16")
TABLE_COLUMNS = (("opt_level", "level"), ("dtype", "dtype"), ("status", "status"), ("steps", "steps"),
                 ("skipped_steps", "skipped"), ("step_time_ms", "step ms"), ("peak_memory_mb", "peak MB"),
                 ("first_loss", "first loss"), ("final_loss", "final loss"), ("loss_scale", "loss scale"),
                 ("casts_per_iteration", "casts/it"))


def _csv(value: str, allowed: Tuple[str, ...], what: str) -> List[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    bad = [item for item in items if item not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"{what}: {bad or value!r} not in {', '.join(allowed)}")
    return items


def parse_args(argv: List[str]) -> argparse.Namespace:
    script_args: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m apexlite sweep",
                                     description="Run a script once per opt level (and dtype) and compare.")
    parser.add_argument("script")
    parser.add_argument("--opt-levels", default="O0,O1,O2,O3",
                        type=lambda v: _csv(v, tuple(OPT_LEVELS), "--opt-levels"))
    parser.add_argument("--dtypes", default="float16", type=lambda v: _csv(v, DTYPES, "--dtypes"))
    parser.add_argument("--json", dest="json_path", help="write the runs as JSON to this file")
    parser.add_argument("--plot", dest="plot_path", help="write loss curves per level to this PNG (matplotlib)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run (default 600)")
    args = parser.parse_args(argv)
    args.script_args = script_args
    return args


def combinations(opt_levels: List[str], dtypes: List[str]) -> List[Tuple[str, str]]:
    """Every (level, dtype) pair; O0 (pure fp32) only once, labelled float32."""
    pairs: List[Tuple[str, str]] = []
    for level in opt_levels:
        for dtype in (["float32"] if level == "O0" else dtypes):
            pairs.append((level, dtype))
    return pairs


def _error_summary(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no error output"


def run_one(script: str, script_args: List[str], level: str, dtype: str, timeout: float) -> Dict[str, Any]:
    """One fresh process for one combination; returns its record (status ok / failed / timeout)."""
    record: Dict[str, Any] = {"opt_level": level, "dtype": dtype, "status": "ok", "error": None}
    record.update({key: None for key in METRICS})
    with tempfile.TemporaryDirectory(prefix="apexlite-sweep-") as tmp:
        telemetry = os.path.join(tmp, "telemetry.json")
        env = dict(os.environ, APEXLITE_OPT_LEVEL=level, APEXLITE_TELEMETRY=telemetry)
        env.pop("APEXLITE_DTYPE", None)
        if dtype != "float32":
            env["APEXLITE_DTYPE"] = dtype
        command = [sys.executable, "-m", "apexlite", "run", script, *script_args]
        start = time.perf_counter()
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            record.update(status="timeout", error=f"did not finish within {timeout:g}s")
            return record
        finally:
            record["wall_time_s"] = round(time.perf_counter() - start, 3)
        if result.returncode != 0:
            record.update(status="failed", error=f"exit code {result.returncode}: {_error_summary(result.stderr)}")
        elif not os.path.exists(telemetry):
            record.update(status="failed", error="the script never called amp.initialize, so nothing was measured")
        if os.path.exists(telemetry):
            with open(telemetry) as handle:
                report = json.load(handle)
            record.update({key: report.get(key) for key in METRICS})
    return record


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(runs: List[Dict[str, Any]]) -> str:
    """A plain-text table, one row per run, failures followed by their error."""
    rows = [[header for _, header in TABLE_COLUMNS]]
    rows += [[_cell(run.get(key)) for key, _ in TABLE_COLUMNS] for run in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for run in runs:
        if run["status"] != "ok":
            lines.append(f"{run['opt_level']} {run['dtype']}: {run['error']}")
    return "\n".join(lines)


def write_plot(runs: List[Dict[str, Any]], path: str, title: str) -> None:
    """Loss curves (loss seen by scale_loss per call) for every run that recorded losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        if run.get("losses"):
            axis.plot(range(len(run["losses"])), run["losses"], label=f"{run['opt_level']} {run['dtype']}")
    axis.set_xlabel("scale_loss call")
    axis.set_ylabel("loss")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _check_matplotlib() -> Optional[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'apexlite[plot]' (or pip install matplotlib)"
    return None


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite sweep`; exit status 1 when any run failed."""
    args = parse_args(argv)
    if not os.path.exists(args.script):
        sys.stderr.write(f"apexlite sweep: no such script: {args.script}\n")
        return 2
    if args.plot_path and _check_matplotlib():
        sys.stderr.write(f"apexlite sweep: {_check_matplotlib()}\n")
        return 2
    pairs = combinations(args.opt_levels, args.dtypes)
    runs = []
    for index, (level, dtype) in enumerate(pairs, start=1):
        print(f"[{index}/{len(pairs)}] {level} {dtype} ...", end=" ", flush=True)
        run = run_one(args.script, args.script_args, level, dtype, args.timeout)
        print(f"{run['status']} ({run['wall_time_s']:.1f}s)" + (f": {run['error']}" if run["error"] else ""),
              flush=True)
        runs.append(run)
    print()
    print(format_table(runs))
    if args.json_path:
        with open(args.json_path, "w") as handle:
            json.dump({"script": args.script, "script_args": args.script_args, "runs": runs}, handle, indent=2)
        print(f"wrote {args.json_path}")
    if args.plot_path:
        write_plot(runs, args.plot_path, os.path.basename(args.script))
        print(f"wrote {args.plot_path}")
    return 0 if all(run["status"] == "ok" for run in runs) else 1
