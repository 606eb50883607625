"""Compile time of apexlite's CPU library: the install's build as it was, and as it is now.

Each configuration compiles csrc/'s CPU sources from scratch with torch's BuildExtension (what
`pip install --no-build-isolation` runs) into a fresh temporary folder, in a subprocess:

* ``before``: the flags setup.py used until issue 23 (the interpreter's CFLAGS, which carry ``-g``) and
  ninja's default parallelism (cores + 2);
* ``after``: apexlite/_native/build_plan.py's flags (``-g0``) and its parallel jobs (the usable cores).

Reported per configuration: wall seconds, the compilers' CPU seconds (user + sys of the children,
nearly independent of what else runs on the machine) and the load average before and after. The
configurations alternate for ``--rounds`` rounds. Usage: python bench/bench_build.py [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from apexlite._native import build_plan as plan

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
BEFORE_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")
SCRIPT = """
import sys
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
sources, includes, flags, lib, temp = sys.argv[1:6]
setup(name="apexlite_build_bench", script_args=["-q", "build_ext", "--build-lib", lib, "--build-temp", temp],
      ext_modules=[CppExtension("apexlite._C", sources.split(","), include_dirs=includes.split(","),
                                extra_compile_args={"cxx": flags.split(",")}, extra_link_args=["-fopenmp"])],
      cmdclass={"build_ext": BuildExtension})
"""
CONFIGS = {
    "before": {"flags": BEFORE_FLAGS, "max_jobs": None},
    "after": {"flags": plan.CXX_FLAGS, "max_jobs": str(plan.parallel_jobs())},
}


def compile_once(name: str) -> Dict[str, float]:
    config = CONFIGS[name]
    env = dict(os.environ)
    env.pop("MAX_JOBS", None)
    if config["max_jobs"]:
        env["MAX_JOBS"] = config["max_jobs"]
    with tempfile.TemporaryDirectory(prefix="apexlite-build-bench-") as work:
        args = [",".join(str(p) for p in plan.cpu_sources(CSRC)), ",".join(str(p) for p in plan.include_dirs(CSRC)),
                ",".join(config["flags"]), f"{work}/lib", f"{work}/tmp"]
        load_before = os.getloadavg()[0]
        used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", SCRIPT, *args], check=True, cwd=work, env=env,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (used.ru_utime - used_before.ru_utime) + (used.ru_stime - used_before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1)}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    results: Dict[str, List[Dict[str, float]]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name in CONFIGS:
            results[name].append(compile_once(name))
            print(name, results[name][-1], flush=True)
    print(json.dumps({"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                      "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
