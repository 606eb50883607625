"""The GPU benchmarks of scripts/gpu_check.sh, written as JSON and as a markdown block for BENCHMARKS.md.

    python -m bench.bench_gpu [--out gpu_check_results] [--sizes 1e7 1e8] [--rounds 7] [--write BENCHMARKS.md]

Figures (bench/gpu_optimizer.py, bench/gpu_training.py): FusedAdam (apexlite's kernel and the
torch-ops path) against torch's fused AdamW at each size, with achieved bandwidth as a share of the
device's peak; the O2 step (bf16 weights, fp32 masters) against torch's upcast + fused + copy chain;
O1 against torch.autocast on a small transformer in fp16 and bf16; peak memory of O0-O3. Targets
(issue 12): FusedAdam <= 1.0x torch fused and >= 85% of peak at 100M params; O1 <= 1.1x autocast.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from datetime import date
from pathlib import Path
from typing import Any, Dict

import torch

from apexlite._native import loader
from bench import gpu_optimizer, gpu_training
from bench.report import replace_block

log = logging.getLogger("bench.gpu")


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render(results: Dict[str, Any], command: str) -> str:
    meta = results["machine"]
    lines = [
        f"## GPU check: {meta['device']} ({meta['date']})", "",
        f"Command: `{command}` (torch {meta['torch']}, CUDA {meta['cuda']}, FusedAdam CUDA kernel: "
        f"{meta['cuda_kernel']}). Peak memory bandwidth used for %: "
        f"{_fmt(results['optimizer']['peak_bandwidth_GBps'], '.0f')} GB/s.", "",
        "| params | case | ms/step | vs torch | achieved GB/s | % of peak |", "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for size, rows in results["optimizer"]["sizes"].items():
        for name, row in rows.items():
            lines.append(f"| {size} | {name} | {row['ms']:.3f} | {row['vs torch']:.2f}x | {row['GB/s']:.0f} | "
                         f"{_fmt(row['% of peak'], '.0f')} |")
    lines += ["", "\"vs torch\": fp32 rows against torch AdamW(fused=True), O2 rows against torch's chain.", "",
              "| O1 vs torch.autocast (small transformer step) | autocast ms | O1 ms | O1 / autocast |",
              "| --- | ---: | ---: | ---: |"]
    for dtype, row in results["o1"].items():
        lines.append(f"| {dtype} | {row['autocast ms']:.2f} | {row['O1 ms']:.2f} | {row['O1 / autocast']:.3f}x |")
    lines += ["", "| peak memory over 3 steps | MiB |", "| --- | ---: |"]
    lines += [f"| {name} | {mib:.0f} |" for name, mib in results["memory"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check_results", help="folder for results.json and results.md")
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e7, 1e8], help="total params per optimizer run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--write", metavar="BENCHMARKS.md", help="also replace the gpu-check block of this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        log.info("bench_gpu: no CUDA device visible; nothing to measure.")
        return 0
    results: Dict[str, Any] = {"machine": {
        "device": torch.cuda.get_device_name(), "date": date.today().isoformat(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "host": platform.node(), "cuda_kernel": loader.kernel_detail("cuda"),
    }}
    log.info("bench_gpu: optimizer steps at %s params", args.sizes)
    results["optimizer"] = gpu_optimizer.run([int(s) for s in args.sizes], args.rounds)
    log.info("bench_gpu: O1 vs torch.autocast")
    results["o1"] = gpu_training.o1_vs_autocast(args.rounds, steps=10)
    log.info("bench_gpu: peak memory O0-O3")
    results["memory"] = gpu_training.peak_memory()
    sizes = " ".join(f"{s:g}" for s in args.sizes)
    text = render(results, f"python -m bench.bench_gpu --sizes {sizes} --rounds {args.rounds}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(text + "\n")
    log.info("%s\n\nwritten to %s/results.json and results.md", text, out)
    if args.write:
        replace_block(args.write, "gpu-check", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
