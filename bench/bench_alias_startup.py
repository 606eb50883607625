"""Interpreter start-up with and without `python -m apexlite alias install` in the environment.

Two fresh venvs (`python -m venv --without-pip`) that see this interpreter's packages through the same
.pth; the alias is installed into one. `python -c pass` and `python -c "import json"` are timed in
both, alternating, and the medians compared; and the modules each has imported when `-c` code starts.
Usage: python bench/bench_alias_startup.py [--runs N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Dict, List

COMMANDS = {"python -c pass": ["-c", "pass"], 'python -c "import json"': ["-c", "import json"]}
LIST_MODULES = "import sys; print(' '.join(sorted(sys.modules)))"


def make_venv(root: Path) -> Path:
    """A venv without pip whose site-packages adds this interpreter's as a site dir; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "apexlite_bench_base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def time_once(python: Path, args: List[str], env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([str(python), *args], check=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    options = parser.parse_args()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as scratch:
        plain = make_venv(Path(scratch, "plain"))
        aliased = make_venv(Path(scratch, "aliased"))
        subprocess.run([str(aliased), "-m", "apexlite", "alias", "install"], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{options.runs} runs each, alternating; medians (ms); "
              f"load average {os.getloadavg()[0]:.1f} at start")
        print("| command | without alias | with alias | difference |")
        print("| --- | ---: | ---: | ---: |")
        for label, args in COMMANDS.items():
            times: Dict[str, List[float]] = {"plain": [], "aliased": []}
            for python in (plain, aliased):  # warm the page cache once
                time_once(python, args, env)
            for _ in range(options.runs):
                times["plain"].append(time_once(plain, args, env))
                times["aliased"].append(time_once(aliased, args, env))
            without, with_alias = (statistics.median(times[key]) * 1e3 for key in ("plain", "aliased"))
            print(f"| `{label}` | {without:.1f} | {with_alias:.1f} | {with_alias - without:+.1f} |")
        modules = [set(subprocess.run([str(python), "-c", LIST_MODULES], capture_output=True, text=True, env=env,
                                      check=True).stdout.split()) for python in (plain, aliased)]
        print(f"modules imported at start-up: {len(modules[0])} without the alias, {len(modules[1])} with it; "
              f"only with it: {sorted(modules[1] - modules[0]) or 'none'}")


if __name__ == "__main__":
    main()
