"""What a sweep prints and writes: environment, the table with its legend, load notes, strict JSON."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
from typing import Any, Dict, List, Optional

import torch

import apexlite

# (row key, header, what the column measures)
COLUMNS = (
    ("opt_level", "level", None),
    ("dtype", "dtype", None),
    ("status", "status", "ok / diverged / stalled / failed / timeout (reasons below the table)"),
    ("steps", "steps", "optimizer step() calls, skipped ones included"),
    ("skipped_steps", "skipped", "steps skipped because the gradients overflowed"),
    ("step_time_ms", "ms/step", "median over the rounds of the round's step time (the median of its slice's "
                                "steps that did not wait for a CPU); '-' below 6 timed rounds"),
    ("step_time_ms_95", "interval", "95% interval of that median (sign test over the rounds)"),
    ("timed_rounds", "rounds", "rounds that timed this run (a slice whose steps mostly waited does not count)"),
    ("peak_tensor_mb", "peak tensor MB", "CUDA: torch.cuda.max_memory_allocated; CPU: peak of live tensor "
                                         "bytes during one step (profiler)"),
    ("state_bytes_per_param", "B/param", "bytes per model parameter after backward: weights, grads, fp32 "
                                         "masters and their grads, optimizer state"),
    ("final_loss", "final loss", "mean of the last 5 losses seen by amp.scale_loss"),
    ("loss_vs_baseline", "loss/base", "final loss / the baseline's final loss"),
    ("loss_scale", "loss scale", "loss scale at the end"),
    ("casts_per_iteration", "casts/it", "O1 casts per iteration"),
)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> Dict[str, Any]:
    """Versions, device, date and threads: what a reader needs to compare two sweeps."""
    return {
        "apexlite": apexlite.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU: {_cpu_name()}",
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def environment_line(env: Dict[str, Any]) -> str:
    return (f"apexlite {env['apexlite']}, torch {env['torch']}, python {env['python']}, {env['device']}, "
            f"{env['torch_threads']} torch threads on {env['cpu_count']} cores, {env['date']}")


def load_notes(peak_load: float, cores: int) -> List[str]:
    """The machine's load, when it was above its core count (the speed section says what that cost)."""
    if peak_load > cores:
        return [f"the machine was loaded: load average up to {peak_load:.2f} on {cores} cores"]
    return []


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and len(value) == 2:  # an interval
        return f"{value[0]:.4g}-{value[1]:.4g}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A plain-text table, one row per combination."""
    cells = [[header for _, header, _ in COLUMNS]]
    cells += [[_cell(row.get(key)) for key, _, _ in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def legend() -> str:
    return "\n".join(f"  {header:15} {meaning}" for _, header, meaning in COLUMNS if meaning)


def format_report(rows: List[Dict[str, Any]], env: Dict[str, Any], speed_lines: List[str], notes: List[str],
                  recommendation: Dict[str, Any], baseline_note: Optional[str]) -> str:
    """Everything the sweep prints after its runs; it ends with the recommendation."""
    parts = [f"environment: {environment_line(env)}", "", format_table(rows), "", "columns:", legend(), "",
             *speed_lines]
    problems = [f"  {row['opt_level']} {row['dtype']} {row['status']}: {row['error']}"
                for row in rows if row["status"] != "ok"]
    if problems:
        parts += ["", "runs that are not ok:", *problems]
    if notes:
        parts += ["", *(f"note: {note}" for note in notes)]
    if baseline_note:
        parts += ["", f"baseline: {baseline_note}"]
    choice = recommendation
    head = f"{choice['opt_level']} {choice['dtype']}" if choice["opt_level"] else "none"
    parts += ["", f"recommendation: {head}", f"  why: {choice['reason']}"]
    return "\n".join(parts)


def strict(value: Any) -> Any:
    """The value with every non-finite float replaced by None, so the JSON has no NaN/Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


def write_json(path: str, document: Dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(strict(document), handle, indent=2, allow_nan=False)
        handle.write("\n")
