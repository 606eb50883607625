"""O2's optimizer side: FusedAdam's fused master step against the separate-masters path (CPU).

    python -m bench.bench_o2_fused [--params 10000000] [--tensors 100] [--rounds 5] [--write BENCHMARKS.md]

Times what O2 adds around one training step once the backward has produced half grads: leaving
`amp.scale_loss` (overflow check / fp32 grad copies and unscale), `optimizer.step()` and `zero_grad`.
The backward itself is replaced by assigning precomputed half grads, so the figures isolate grad
handling and the update. Cases, timed round-robin in one process (medians over rounds):
- fused: `amp.initialize(..., "O2")` with FusedAdam (default: masters in the optimizer, kernel unscales);
- separate: the same with `optimizer.amp_fused_master_step = False` (fp32 master grads, then copy back);
- torch separate: O2 with `torch.optim.AdamW(fused=True)` on the fp32 masters;
- torch fp32 fused step: plain `AdamW(fused=True)` on fp32 params and grads, no amp (the floor).
"""
from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time
from datetime import date
from typing import Dict, List

import torch

from apexlite import amp
from apexlite.optimizers import FusedAdam
from bench.report import replace_block

log = logging.getLogger("bench.o2_fused")
CASES = ("fused", "separate", "torch separate", "torch fp32 fused step")


def make_model(total: int, tensors: int) -> torch.nn.ParameterList:
    torch.manual_seed(0)
    size = total // tensors
    return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(size) * 0.1) for _ in range(tensors)])


def make_optimizer(case: str, params) -> torch.optim.Optimizer:
    if case.startswith("torch"):
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    optimizer = FusedAdam(params, lr=1e-3)
    optimizer.amp_fused_master_step = case == "fused"
    return optimizer


def time_case(case: str, dtype: torch.dtype, total: int, tensors: int, steps: int) -> float:
    """Median seconds per iteration of one case (a fresh amp session per call)."""
    model = make_model(total, tensors)
    optimizer = make_optimizer(case, model.parameters())
    scale = 2.0 ** 16 if dtype is torch.float16 else 1.0
    if case == "torch fp32 fused step":
        grads = [torch.randn_like(p) * 1e-4 for p in model.parameters()]

        def iteration() -> None:
            for param, grad in zip(model.parameters(), grads):
                param.grad = grad
            optimizer.step()
            optimizer.zero_grad()
    else:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O2", dtype=dtype, verbosity=0)
        grads = [(torch.randn_like(p, dtype=torch.float32) * 1e-4 * scale).to(dtype) for p in model.parameters()]
        dummy = torch.zeros((), requires_grad=True)

        def iteration() -> None:
            with amp.scale_loss(dummy, optimizer):
                for param, grad in zip(model.parameters(), grads):
                    param.grad = grad
            optimizer.step()
            optimizer.zero_grad()
    try:
        samples = []
        for index in range(steps + 2):
            start = time.perf_counter()
            iteration()
            if index >= 2:
                samples.append(time.perf_counter() - start)
        return statistics.median(samples)
    finally:
        amp.deinitialize()


def run(total: int, tensors: int, rounds: int, steps: int) -> Dict[str, Dict[str, float]]:
    results: Dict[str, Dict[str, List[float]]] = {}
    for dtype in (torch.bfloat16, torch.float16):
        per_case: Dict[str, List[float]] = {case: [] for case in CASES}
        for round_index in range(rounds):
            for case in CASES:
                per_case[case].append(time_case(case, dtype, total, tensors, steps))
            log.info("%s round %d/%d done", dtype, round_index + 1, rounds)
        results[str(dtype).replace("torch.", "")] = {c: statistics.median(v) for c, v in per_case.items()}
    return results


def render(results: Dict[str, Dict[str, float]], total: int, tensors: int, command: str) -> str:
    lines = [
        "## O2 with FusedAdam: fused master step vs separate fp32 master grads (CPU)",
        "",
        f"Command: `{command}` ({date.today().isoformat()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}). "
        f"{total / 1e6:.0f}M params in {tensors} tensors; per iteration: leaving `scale_loss`, `step()`, "
        "`zero_grad()` (the backward is replaced by assigning precomputed half grads). Medians of rounds, "
        "cases interleaved in one process.",
        "",
        "| dtype | case | ms/iter | vs fused | vs torch fp32 fused step |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for dtype, cases in results.items():
        fused, floor = cases["fused"], cases["torch fp32 fused step"]
        for case, seconds in cases.items():
            lines.append(f"| {dtype} | {case} | {seconds * 1e3:.2f} | {seconds / fused:.2f}x | {seconds / floor:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--write", metavar="BENCHMARKS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = run(args.params, args.tensors, args.rounds, args.steps)
    command = (f"python -m bench.bench_o2_fused --params {args.params} --tensors {args.tensors} "
               f"--rounds {args.rounds} --steps {args.steps}")
    text = render(results, args.params, args.tensors, command)
    log.info("%s", text)
    if args.write:
        replace_block(args.write, "o2-fused", text)


if __name__ == "__main__":
    main()
