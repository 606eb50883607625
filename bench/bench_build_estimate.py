"""The first-use build's announced time against the time it took, on an idle machine and beside CPU hogs.

Each run is a fresh process that compiles the CPU library the way a first use does (apexlite's loader,
its lines on stderr: the estimate before, the steps while it runs, the time after) into a new folder
of one temporary TORCH_EXTENSIONS_DIR, whose build-time history the runs share: the first run's
estimate comes from the reference machine's figures, later ones from the builds before them. A loaded
run starts ``--hogs`` busy processes (``python -c 'while 1: pass'``) ``--settle`` seconds before the
build and ends them after it. Conditions alternate: idle, loaded, idle, loaded...

Usage: python bench/bench_build_estimate.py [--rounds 2] [--hogs 2] [--settle 5]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

CHILD = """
import dataclasses, json, sys
from pathlib import Path
from apexlite._native import build_time, jit_build, loader
from apexlite._native.kernel_state import Finding
seen = []
measure = build_time.this_machine
build_time.this_machine = lambda jobs: seen.append(measure(jobs)) or seen[-1]  # what the estimate saw
library = jit_build.CachedLibrary("cpu", Path(sys.argv[1]))
built, detail = loader._build(Finding("buildable", "bench", library), "cpu")
print("MACHINE", json.dumps(dataclasses.asdict(seen[0])))
print("BUILD", json.dumps(dataclasses.asdict(build_time.read_history(build_time.history_file())[-1])))
sys.exit(0 if built else 1)
"""
SECONDS = {"s": 1, "min": 60}


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * SECONDS[unit]


def build_once(extensions: str, index: int, hogs: int, settle: float) -> Dict[str, object]:
    started_hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
    try:
        time.sleep(settle if hogs else 0)
        load_before = os.getloadavg()[0]
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=extensions)
        env.pop("MAX_JOBS", None)
        done = subprocess.run([sys.executable, "-c", CHILD, os.path.join(extensions, "apexlite", f"run{index}")],
                              capture_output=True, text=True, env=env, check=False)
    finally:
        for hog in started_hogs:
            hog.kill()
            hog.wait()
    said = done.stderr
    before = re.search(r"first use, about ([\d.]+ (?:s|min)): (.*); cached in", said)
    after = re.search(r"compiled apexlite's .* in (\d+) s", said)
    if done.returncode or not before or not after:
        raise SystemExit(f"run {index} did not build:\n{said}\n{done.stdout}")
    facts = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
             if line.startswith(("MACHINE ", "BUILD "))}
    estimate, measured = _seconds(before.group(1)), float(after.group(1))
    return {"hogs": hogs, "estimate_s": estimate, "measured_s": measured, "ratio": round(measured / estimate, 2),
            "basis": before.group(2), "machine": facts["MACHINE"], "cpu_s": facts["BUILD"]["cpu_seconds"],
            "loadavg_before": round(load_before, 1), "loadavg_after": round(os.getloadavg()[0], 1),
            "progress_lines": len(re.findall(r"steps done after", said))}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="idle + loaded pairs")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds the hogs run before a loaded build")
    args = parser.parse_args(argv)
    import torch

    runs = []
    with tempfile.TemporaryDirectory(prefix="apexlite-estimate-bench-") as extensions:
        for index in range(2 * args.rounds):
            runs.append(build_once(extensions, index, args.hogs if index % 2 else 0, args.settle))
            print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                      "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
