"""`apexlite migrate`'s cost against script length: rewrite seconds and peak memory for generated legacy apex
scripts of 300, 1,000, 3,000 and 10,000 lines (bench/migrate_scripts.py: real scripts' fragments), and for a
10,000-line script that uses no apex at all.

Each measurement is a fresh process: it imports apexlite's migrate engine (start-up, not counted), then
times `migrate_source` on the script (CPU seconds and wall seconds) and reads the process's peak RSS
before and after (the peak the rewrite added). Every size runs --runs times, alternating sizes; the
medians are reported with the cost per 1,000 lines, whose flatness is the linearity check.
Usage: python bench/bench_migrate.py [--runs N] [--sizes 300,1000,3000,10000] [--write]
(--write puts the table into BENCHMARKS.md's migrate block).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from migrate_scripts import generate  # noqa: E402  (bench/ is not a package on the path)

CHILD = r"""
import json, resource, sys, time
from apexlite.migrate.engine import migrate_source
source = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu, wall = time.process_time(), time.perf_counter()
result = migrate_source(source)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "rss_before_mb": before / 1024, "rss_peak_mb": after / 1024,
                  "todos": len(result.todos), "changed": result.changed, "error": result.error}))
"""


def plain_script(lines: int) -> str:
    """The same fragments with every apex name taken out: a script migrate has nothing to do in."""
    text = generate(lines)
    for old, new in [("from apex import amp\n", ""), ("from apex.normalization import FusedLayerNorm\n",
                                                      "from torch.nn import LayerNorm as FusedLayerNorm\n"),
                     ("from apex.optimizers import FusedAdam\n", "from torch.optim import AdamW as FusedAdam\n"),
                     ("from apex.parallel import DistributedDataParallel as DDP\n",
                      "from torch.nn.parallel import DistributedDataParallel as DDP\n")]:
        text = text.replace(old, new)
    return text.replace("amp.", "torch_amp_stub.").replace("apex", "x")


def measure(path: str) -> Dict[str, float]:
    result = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, check=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(sizes: List[int], runs: int) -> List[Dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="apexlite-bench-migrate-") as tmp:
        cases = []
        for size in sizes:
            path = os.path.join(tmp, f"apex_{size}.py")
            with open(path, "w") as handle:
                handle.write(generate(size))
            cases.append((f"apex script, {size} lines", path))
        plain = os.path.join(tmp, f"plain_{max(sizes)}.py")
        with open(plain, "w") as handle:
            handle.write(plain_script(max(sizes)))
        cases.append((f"no apex, {max(sizes)} lines", plain))
        samples: Dict[str, List[Dict[str, float]]] = {label: [] for label, _ in cases}
        for _ in range(runs):
            for label, path in cases:
                samples[label].append(measure(path))
        rows = []
        for label, path in cases:
            lines = sum(1 for _ in open(path))
            cpu = statistics.median(s["cpu_s"] for s in samples[label])
            wall = statistics.median(s["wall_s"] for s in samples[label])
            peak = statistics.median(s["rss_peak_mb"] for s in samples[label])
            added = statistics.median(s["rss_peak_mb"] - s["rss_before_mb"] for s in samples[label])
            rows.append({"case": label, "lines": lines, "cpu_s": cpu, "wall_s": wall, "per_1000_lines_s": cpu * 1000 / lines,
                         "peak_rss_mb": peak, "added_peak_mb": added, "todos": samples[label][0]["todos"]})
        return rows


def markdown(rows: List[Dict[str, object]], runs: int) -> str:
    head = ["| script | lines | rewrite CPU s | wall s | CPU s per 1,000 lines | peak RSS MB | added by the rewrite MB "
            "| TODOs |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    body = [f"| {r['case']} | {r['lines']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['per_1000_lines_s']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['added_peak_mb']:.0f} | {r['todos']} |" for r in rows]
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    note = (f"Medians of {runs} fresh processes per size ({machine}; {datetime.date.today()}), from "
            "`python bench/bench_migrate.py --runs {runs}`. Start-up (importing the engine) is not counted.")
    title = "## `apexlite migrate`: cost against script length (CPU)"
    return "\n".join([title, "", *head, *body, "", note.replace("{runs}", str(runs))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="300,1000,3000,10000")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()
    rows = run([int(size) for size in args.sizes.split(",")], args.runs)
    text = markdown(rows, args.runs)
    print(text)
    if args.write:
        from report import replace_block

        replace_block(os.path.join(os.path.dirname(HERE), "BENCHMARKS.md"), "migrate", text)


if __name__ == "__main__":
    main()
