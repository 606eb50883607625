"""The sweep loop: parse, run every combination (repeats alternating), judge, report."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from apexlite.sweep import verdict
from apexlite.sweep.options import combinations, parse_args, schedule
from apexlite.sweep.process import run_one
from apexlite.sweep.report import environment, format_report, load_notes, write_json


def _progress(index: int, total: int, pair: Tuple[str, str], repeat: int, repeats: int) -> str:
    again = f" (repeat {repeat + 1}/{repeats})" if repeats > 1 else ""
    return f"[{index}/{total}] {pair[0]} {pair[1]}{again} ..."


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite sweep`; exit status 1 when any run is not ok, 2 on bad options."""
    args = parse_args(argv)
    pairs = combinations(args.opt_levels, args.dtypes)
    order = schedule(pairs, args.repeats)
    env = environment()
    peak_load = os.getloadavg()[0]
    records: Dict[Tuple[str, str], List[Dict[str, Any]]] = {pair: [] for pair in pairs}
    for index, (repeat, pair) in enumerate(order, start=1):
        print(_progress(index, len(order), pair, repeat, args.repeats), end=" ", flush=True)
        record = verdict.classify(run_one(args.script, args.script_args, pair[0], pair[1], args.timeout,
                                          args.max_steps, args.warmup))
        peak_load = max(peak_load, os.getloadavg()[0])
        print(f"{record['status']} ({record['wall_time_s']:.1f}s)" + (f": {record['error']}" if record["error"]
                                                                     else ""), flush=True)
        records[pair].append(record)
    rows = [verdict.combine(records[pair]) for pair in pairs]
    baseline, baseline_note = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    recommendation = verdict.recommend(rows, baseline, baseline_note, args.tolerance)
    notes = load_notes(rows, peak_load, os.cpu_count() or 1)
    env["peak_load_average"] = peak_load
    print()
    print(format_report(rows, env, notes, recommendation, baseline_note))
    if args.json_path:
        options = {key: getattr(args, key) for key in ("opt_levels", "dtypes", "max_steps", "warmup", "repeats",
                                                       "tolerance", "timeout")}
        write_json(args.json_path, {"script": args.script, "script_args": args.script_args, "options": options,
                                    "environment": env, "notes": notes, "runs": rows,
                                    "recommendation": recommendation})
        print(f"wrote {args.json_path}")
    if args.plot_path:
        from apexlite.sweep.plot import write_plot

        write_plot(rows, args.plot_path, os.path.basename(args.script))
        print(f"wrote {args.plot_path}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1
