"""O1 benchmark: per-call overhead of patched ops, and training-step time vs torch.autocast and fp32.

    python -m bench.bench_o1 [--rounds 15] [--steps 10] [--write BENCHMARKS.md]

Every variant runs side by side in one process, interleaved round by round; figures are medians.
"""
from __future__ import annotations

import argparse
import logging
import copy
import platform
import statistics
import time
from datetime import date
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from apexlite import amp
from bench.report import replace_block

log = logging.getLogger("bench.o1")

CASES = {
    # name: (dtype, in_features, hidden, layers, batch, dynamic loss scaling)
    "compute-bound MLP (bf16, 1024 wide, batch 256)": (torch.bfloat16, 1024, 1024, 4, 256, False),
    "overhead-bound tiny MLP (bf16, 16 layers of 32, batch 8)": (torch.bfloat16, 32, 32, 16, 8, False),
    "fp16 + dynamic loss scaling (64 wide, batch 64)": (torch.float16, 64, 64, 3, 64, True),
}


def make_mlp(features: int, hidden: int, layers: int) -> torch.nn.Module:
    blocks: List[torch.nn.Module] = []
    width = features
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 1))


def timed(step: Callable[[], None], steps: int) -> float:
    """Median seconds per step over `steps` steps (after one warm-up step)."""
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_fns(model: torch.nn.Module, x, y, dtype, dynamic: bool) -> Dict[str, Callable[[], None]]:
    """One training step per variant, each on its own copy of the model and optimizer."""
    fns = {}
    fp32_model = copy.deepcopy(model)
    fp32_opt = torch.optim.SGD(fp32_model.parameters(), lr=1e-3)

    def fp32_step():
        F.mse_loss(fp32_model(x), y).backward()
        fp32_opt.step()
        fp32_opt.zero_grad()

    fns["fp32"] = fp32_step
    ac_model = copy.deepcopy(model)
    ac_opt = torch.optim.SGD(ac_model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if dynamic else None

    def autocast_step():
        with torch.autocast("cpu", dtype=dtype):
            loss = F.mse_loss(ac_model(x).float(), y)
        if scaler is None:
            loss.backward()
            ac_opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(ac_opt)
            scaler.update()
        ac_opt.zero_grad()

    fns["torch.autocast" + (" + GradScaler" if dynamic else "")] = autocast_step
    return fns


def run_case(name: str, spec, rounds: int, steps: int) -> Dict[str, float]:
    dtype, features, hidden, layers, batch, dynamic = spec
    torch.manual_seed(0)
    model = make_mlp(features, hidden, layers)
    x, y = torch.randn(batch, features), torch.randn(batch, 1)
    fns = step_fns(model, x, y, dtype, dynamic)
    apex_model = copy.deepcopy(model)
    apex_opt = torch.optim.SGD(apex_model.parameters(), lr=1e-3)
    loss_scale = "dynamic" if dynamic else 1.0

    def apexlite_step():
        loss = F.mse_loss(apex_model(x).float(), y)
        with amp.scale_loss(loss, apex_opt) as scaled:
            scaled.backward()
        apex_opt.step()
        apex_opt.zero_grad()

    def apexlite_block() -> float:
        amp.initialize(apex_model, apex_opt, opt_level="O1", dtype=dtype, loss_scale=loss_scale, verbosity=0)
        try:
            return timed(apexlite_step, steps)
        finally:
            amp.deinitialize()

    blocks = {key: (lambda fn=fn: timed(fn, steps)) for key, fn in fns.items()}
    blocks["apexlite O1"] = apexlite_block
    results: Dict[str, List[float]] = {key: [] for key in blocks}
    order = list(blocks)
    for round_index in range(rounds):
        # alternate the order every round so no variant always runs first or last (drift, turbo)
        for key in (order if round_index % 2 == 0 else order[::-1]):
            results[key].append(blocks[key]())
    return {key: statistics.median(values) for key, values in results.items()}


def per_call_overhead(rounds: int) -> Dict[str, float]:
    """Microseconds per call of F.linear / torch.mm on tiny fp32 inputs: plain, autocast, apexlite O1."""
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(8, 8)
    calls = {"F.linear": lambda: F.linear(x, w), "torch.mm": lambda: torch.mm(x, w)}
    out = {}
    for label, fn in calls.items():
        def loop():
            for _ in range(200):
                fn()
        plain, autocast, patched = [], [], []
        for _ in range(rounds):
            plain.append(timed(loop, 5) / 200)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                autocast.append(timed(loop, 5) / 200)
            amp.initialize(torch.nn.Linear(1, 1), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
            try:
                patched.append(timed(loop, 5) / 200)
            finally:
                amp.deinitialize()
        out[label] = tuple(statistics.median(v) * 1e6 for v in (plain, autocast, patched))
    return out


def render(case_results: Dict[str, Dict[str, float]], overhead: Dict[str, tuple], rounds: int, steps: int) -> str:
    lines = [
        "## O1 vs torch.autocast (CPU)", "",
        "Each round times every variant in its own block of steps, in an order that alternates between "
        "rounds; apexlite is initialized before and deinitialized after its block, so the other "
        "variants run on unpatched torch.", "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"date {date.today().isoformat()}; command `python -m bench.bench_o1 --rounds {rounds} --steps {steps}`.",
        "", "Per-call cost on tiny (8x8) fp32 inputs, bf16 target (median µs per call):", "",
        "| op | unpatched | torch.autocast | apexlite O1 |", "|---|---|---|---|",
    ]
    lines += [f"| `{k}` | {a:.2f} | {b:.2f} | {c:.2f} |" for k, (a, b, c) in overhead.items()]
    lines += ["", "Training step (median ms per step; ratio = apexlite O1 / torch.autocast):", "",
              "| case | fp32 | torch.autocast | apexlite O1 | ratio vs autocast | ratio vs fp32 |",
              "|---|---|---|---|---|---|"]
    for case, res in case_results.items():
        autocast_key = next(k for k in res if k.startswith("torch.autocast"))
        ratio = res["apexlite O1"] / res[autocast_key]
        lines.append(f"| {case} | {res['fp32'] * 1e3:.3f} | {res[autocast_key] * 1e3:.3f} | "
                     f"{res['apexlite O1'] * 1e3:.3f} | {ratio:.3f} | {res['apexlite O1'] / res['fp32']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write", metavar="FILE", help="replace the o1 block of this markdown file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overhead = per_call_overhead(args.rounds)
    case_results = {name: run_case(name, spec, args.rounds, args.steps) for name, spec in CASES.items()}
    text = render(case_results, overhead, args.rounds, args.steps)
    log.info("%s", text)
    if args.write:
        replace_block(args.write, "o1", text)


if __name__ == "__main__":
    main()
