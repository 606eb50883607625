"""The sweep: parse, time every combination in rounds (once per repeat), judge, report."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from apexlite.sweep import verdict
from apexlite.sweep.options import combinations, parse_args
from apexlite.sweep.report import environment, format_report, load_notes, write_json
from apexlite.sweep.rounds import RoundsOptions, RoundTimes, time_in_rounds
from apexlite.sweep.speed import SpeedTable

Pair = Tuple[str, str]


def _progress(message: str) -> None:
    print(f"  {message}", flush=True)


def _measure(args: Any, pairs: List[Pair]) -> Tuple[Dict[Pair, List[Dict[str, Any]]], RoundTimes, float]:
    """Every repeat's records per combination, the rounds of all repeats pooled, and the peak load average."""
    records: Dict[Pair, List[Dict[str, Any]]] = {pair: [] for pair in pairs}
    pooled = RoundTimes.empty(pairs)
    peak_load = os.getloadavg()[0]
    options = RoundsOptions(args.script, args.script_args, args.timeout, args.max_steps, args.warmup,
                            args.budget / args.repeats, args.precision)
    for repeat in range(args.repeats):
        order = pairs if repeat % 2 == 0 else pairs[::-1]
        print(f"[{repeat + 1}/{args.repeats}] starting {len(order)} runs, each paused after its warm-up: "
              + ", ".join(f"{level} {dtype}" for level, dtype in order), flush=True)
        finished, times = time_in_rounds(order, options, _progress)
        for pair in pairs:
            records[pair].append(verdict.classify(finished[pair]))
        pooled.extend(times)
        peak_load = max(peak_load, os.getloadavg()[0])
    return records, pooled, peak_load


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite sweep`; exit status 1 when any run is not ok, 2 on bad options."""
    args = parse_args(argv)
    pairs = combinations(args.opt_levels, args.dtypes)
    env = environment()
    records, times, peak_load = _measure(args, pairs)
    speed = SpeedTable(times)
    rows = [verdict.combine(records[pair]) for pair in pairs]
    for row, pair in zip(rows, pairs):
        interval = speed.step_time_interval_ms(pair)  # a step time is stated only with its interval
        row.update(step_time_ms=speed.step_time_ms(pair) if interval is not None else None,
                   step_time_ms_95=list(interval) if interval is not None else None,
                   timed_rounds=speed.timed_rounds(pair),
                   round_step_times_ms=[None if value is None else value * 1e3 for value in times.wall[pair]])
    baseline, baseline_note = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    recommendation = verdict.recommend(rows, baseline, baseline_note, args.tolerance, speed)
    speed_base = (baseline["opt_level"], baseline["dtype"]) if baseline else pairs[0]
    notes = load_notes(peak_load, os.cpu_count() or 1) + speed.notes(pairs) + verdict.precision_notes(rows)
    env["peak_load_average"] = peak_load
    print()
    print(format_report(rows, env, speed.report_lines(speed_base, pairs), notes, recommendation, baseline_note))
    if args.json_path:
        options = {key: getattr(args, key) for key in ("opt_levels", "dtypes", "max_steps", "warmup", "repeats",
                                                       "tolerance", "timeout", "budget", "precision")}
        write_json(args.json_path, {"script": args.script, "script_args": args.script_args, "options": options,
                                    "environment": env, "notes": notes, "speed": speed.summary(speed_base, pairs),
                                    "runs": rows, "recommendation": recommendation})
        print(f"wrote {args.json_path}")
    if args.plot_path:
        from apexlite.sweep.plot import write_plot

        write_plot(rows, args.plot_path, os.path.basename(args.script))
        print(f"wrote {args.plot_path}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1
