"""`apexlite migrate`'s cost against input size: seconds and peak memory for generated legacy apex scripts
(bench/migrate_scripts.py: real scripts' fragments, every block using amp) of 1,250 to 20,000 lines, a
20,000-line script that names no apex, and whole repositories (`--repository PATH`, migrated as
`migrate PATH` does, nothing written: a timm checkout, say).

Each measurement is a fresh process: it imports apexlite's migrate engine (start-up, not counted), then
times the migration (CPU seconds and wall seconds) and reads the process's peak RSS before and after (the
peak the migration added). Every case runs --runs times, alternating cases; the medians are reported with
the CPU cost per 1,000 lines, whose flatness across sizes is the linearity check, and the added peak per
1,000 lines (memory follows the size of the largest file, not the repository's).
`--compare CHECKOUT` measures another apexlite checkout's engine (an older commit, say) on the same inputs,
each run of it right after this one's, and adds its rows and the ratio.
Usage: python bench/bench_migrate.py [--runs N] [--sizes 1250,2500,5000,10000,20000] [--repository PATH]...
[--compare CHECKOUT] [--write]   (--write puts the table into BENCHMARKS.md's migrate-cost block)
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
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from migrate_scripts import generate  # noqa: E402  (bench/ is not a package on the path)

SCRIPT_CHILD = r"""
import json, resource, sys, time
from apexlite.migrate.engine import migrate_source
source = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu, wall = time.process_time(), time.perf_counter()
result = migrate_source(source)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "rss_before_mb": before / 1024, "rss_peak_mb": after / 1024,
                  "todos": len(result.todos), "files": 1, "largest": source.count(b"\n")}))
"""
REPOSITORY_CHILD = r"""
import json, resource, sys, time
from apexlite.migrate.files import load, migrate_all
from apexlite.migrate.options import MigrateOptions
from apexlite.script_paths import collect
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu, wall = time.process_time(), time.perf_counter()
files = [load(target) for target in collect([sys.argv[1]]).targets]
migrate_all(files, MigrateOptions())
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
read = [item for item in files if item.program is not None]
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "rss_before_mb": before / 1024, "rss_peak_mb": after / 1024,
                  "todos": sum(len(item.result.todos) for item in read if item.result is not None),
                  "files": len(files), "largest": max(item.program.source.count(b"\n") for item in read)}))
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


ROOT = os.path.dirname(HERE)


def measure(child: str, path: str, engine: str = ROOT) -> Dict[str, float]:
    """One fresh process migrating `path` with the apexlite checkout at `engine` (run outside any checkout,
    so `python -c` finds that one's package first)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=engine)
    result = subprocess.run([sys.executable, "-c", child, path], capture_output=True, text=True, check=True, env=env,
                            cwd=os.path.dirname(os.path.abspath(path)))
    return json.loads(result.stdout.strip().splitlines()[-1])


def _lines(path: str) -> int:
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    total = 0
    for parent, folders, files in os.walk(path):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            if name.endswith((".py", ".ipynb")):
                with open(os.path.join(parent, name), "rb") as handle:
                    total += handle.read().count(b"\n")
    return total


def run(sizes: List[int], repositories: List[str], runs: int, compare: str = "") -> List[Dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="apexlite-bench-migrate-") as tmp:
        cases: List[Tuple[str, str, str]] = []
        for size in sizes:
            path = os.path.join(tmp, f"apex_{size}.py")
            with open(path, "w") as handle:
                handle.write(generate(size))
            cases.append((f"apex script, {size} lines", SCRIPT_CHILD, path))
        plain = os.path.join(tmp, f"plain_{max(sizes)}.py")
        with open(plain, "w") as handle:
            handle.write(plain_script(max(sizes)))
        cases.append((f"no apex, {max(sizes)} lines", SCRIPT_CHILD, plain))
        cases += [(f"repository {os.path.basename(os.path.normpath(path))}", REPOSITORY_CHILD, path)
                  for path in repositories]
        engines = [("", ROOT)] + ([(f" ({os.path.basename(os.path.normpath(compare))})", compare)] if compare else [])
        samples: Dict[str, List[Dict[str, float]]] = {}
        for _ in range(runs):
            for label, child, path in cases:
                for suffix, engine in engines:
                    samples.setdefault(label + suffix, []).append(measure(child, path, engine))
        rows = []
        for label, _, path in [(label + suffix, child, path) for label, child, path in cases for suffix, _ in engines]:
            lines = _lines(path)
            taken = samples[label]
            cpu = statistics.median(s["cpu_s"] for s in taken)
            added = statistics.median(s["rss_peak_mb"] - s["rss_before_mb"] for s in taken)
            rows.append({"case": label, "files": taken[0]["files"], "lines": lines, "largest": taken[0]["largest"],
                         "cpu_s": cpu, "wall_s": statistics.median(s["wall_s"] for s in taken),
                         "per_1000_lines_s": cpu * 1000 / lines,
                         "peak_rss_mb": statistics.median(s["rss_peak_mb"] for s in taken), "added_peak_mb": added,
                         "added_per_1000_largest_mb": added * 1000 / max(taken[0]["largest"], 1),
                         "todos": taken[0]["todos"]})
        return rows


def markdown(rows: List[Dict[str, object]], runs: int, command: str, load: str) -> str:
    head = ["| input | files | lines | largest file, lines | CPU s | wall s | CPU s per 1,000 lines | peak RSS MB "
            "| added by migrate MB | added MB per 1,000 lines of the largest file | TODOs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    body = [f"| {r['case']} | {r['files']} | {r['lines']} | {r['largest']} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | "
            f"{r['per_1000_lines_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['added_peak_mb']:.0f} | "
            f"{r['added_per_1000_largest_mb']:.1f} | {r['todos']} |" for r in rows]
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    note = (f"Medians of {runs} fresh processes per input ({machine}; {datetime.date.today()}; load average "
            f"{load} when it started), from `{command}`. Start-up (importing the engine) is not counted.")
    title = "## `apexlite migrate`: cost against input size (CPU)"
    return "\n".join([title, "", *head, *body, "", note])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1250,2500,5000,10000,20000")
    parser.add_argument("--repository", action="append", default=[], metavar="PATH",
                        help="a checkout to migrate as a whole, nothing written (may repeat)")
    parser.add_argument("--compare", default="", metavar="CHECKOUT",
                        help="another apexlite checkout whose engine runs right after this one on every input")
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    rows = run([int(size) for size in args.sizes.split(",")], [os.path.abspath(path) for path in args.repository],
               args.runs, os.path.abspath(args.compare) if args.compare else "")
    command = "python bench/bench_migrate.py " + " ".join(sys.argv[1:]).replace(" --write", "")
    text = markdown(rows, args.runs, command.strip(), load)
    print(text)
    if args.write:
        from report import replace_block

        replace_block(os.path.join(os.path.dirname(HERE), "BENCHMARKS.md"), "migrate-cost", text)


if __name__ == "__main__":
    main()
