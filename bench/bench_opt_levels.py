"""O0-O3 on a small transformer (CPU): step time vs O0 and vs torch.autocast, peak memory, bytes/param.

The runs are timed round by round (every run once per round, alternating the order) and the ratios are
paired by round, with the sweep's 95% intervals (apexlite.sweep.intervals), so machine load that comes
and goes moves both sides of a ratio together instead of deciding it.

    python -m bench.bench_opt_levels [--rounds 7] [--write BENCHMARKS.md]

Bytes per parameter count what training holds right after backward (the peak between backward and
step): model params + model grads + fp32 masters + master grads + optimizer state.
"""
from __future__ import annotations

import argparse
import logging
import copy
import os
import platform
import statistics
from datetime import date
from typing import Any, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from apexlite import amp
from apexlite.optimizers import FusedAdam
from apexlite.sweep.intervals import speed_ratio
from bench.bench_o1 import timed
from bench.report import replace_block

log = logging.getLogger("bench.opt_levels")

D_MODEL, HEADS, LAYERS, SEQ, BATCH, VOCAB = 64, 4, 2, 32, 8, 128


class TinyTransformer(torch.nn.Module):
    """Token embedding, a transformer encoder and a vocabulary head (this benchmark's and the GPU check's)."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS, layers: int = LAYERS, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def step_peak_bytes(step) -> float:
    """Peak of tensor bytes allocated during one call of `step` above what existed before it.

    Read from the profiler's memory events (CPU torch keeps no allocator statistics of its own).
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return float(peak)


def resident_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Tensors that live across steps: model params and buffers, fp32 masters, optimizer state."""
    params = list(model.parameters())
    stepped = [p for group in opt.param_groups for p in group["params"]]
    masters = [p for p in stepped if all(p is not q for q in params)]
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return tensor_bytes(params) + tensor_bytes(model.buffers()) + tensor_bytes(masters) + tensor_bytes(state)


def bytes_per_param(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    params = list(model.parameters())
    stepped = [p for group in opt.param_groups for p in group["params"]]
    masters = [p for p in stepped if all(p is not q for q in params)]
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    total = (tensor_bytes(params) + tensor_bytes(p.grad for p in params) + tensor_bytes(masters)
             + tensor_bytes(m.grad for m in masters) + tensor_bytes(state))
    return total / sum(p.numel() for p in params)


LEVELS = ("O0", "O1", "O2", "O2+FusedAdam", "O3", "autocast")
DTYPES = (torch.bfloat16, torch.float16)


def _one(base: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor, level: str, dtype: torch.dtype,
         steps: int, measure_memory: bool) -> Dict[str, float]:
    """One fresh model at one level (O2/O3 cast it for good): median step seconds, and memory when asked."""
    model = copy.deepcopy(base)
    if level == "O2+FusedAdam":  # masters kept inside FusedAdam, unscaled in its kernel
        opt = FusedAdam(model.parameters(), lr=1e-4, eps=1e-4, adam_w_mode=False)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4)
    scaler = torch.amp.GradScaler("cpu") if dtype is torch.float16 else None

    def loss_fn():
        return F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())

    def apex_step():
        with amp.scale_loss(loss_fn(), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()

    def autocast_step():
        with torch.autocast("cpu", dtype=dtype):
            loss = loss_fn()
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()

    result: Dict[str, float] = {}
    if level == "autocast":
        result["s"] = timed(autocast_step, steps)
        if measure_memory:
            result.update(peak=resident_bytes(model, opt) + step_peak_bytes(autocast_step), bytes=float("nan"))
        return result
    amp.initialize(model, opt, opt_level=level[:2], dtype=dtype, verbosity=0)
    try:
        result["s"] = timed(apex_step, steps)
        if measure_memory:
            result["peak"] = resident_bytes(model, opt) + step_peak_bytes(apex_step)
            with amp.scale_loss(loss_fn(), opt) as scaled:
                scaled.backward()
            result["bytes"] = bytes_per_param(model, opt)
            opt.zero_grad()
    finally:
        amp.deinitialize()
    return result


def run(rounds: int, steps: int) -> Dict[str, Dict[str, Any]]:
    """Every (level, dtype) once per round, rounds alternating their order, so each pair is compared on the
    same machine moments apart; per key: the median step time per round, peak memory and bytes/param."""
    torch.manual_seed(0)
    base = TinyTransformer()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    targets = torch.randint(0, VOCAB, (BATCH, SEQ))
    keys = [(level, dtype) for dtype in DTYPES for level in LEVELS]
    results: Dict[str, Dict[str, Any]] = {f"{level} {str(dtype)[6:]}": {"rounds": []} for level, dtype in keys}
    for round_index in range(rounds):
        for level, dtype in (keys if round_index % 2 == 0 else keys[::-1]):
            measured = _one(base, tokens, targets, level, dtype, steps, measure_memory=round_index == 0)
            entry = results[f"{level} {str(dtype)[6:]}"]
            entry["rounds"].append(measured.pop("s"))
            entry.update(measured)
    for entry in results.values():
        entry["ms"] = statistics.median(entry["rounds"]) * 1e3
    return results


def _versus(times: List[float], reference: List[float]) -> str:
    """Step time relative to `reference` (above 1: slower), paired by round, with its 95% interval."""
    return speed_ratio(times, reference).text()


def render(results: Dict[str, Dict[str, Any]], rounds: int, loads: Tuple[float, float]) -> str:
    threads = os.environ.get("OMP_NUM_THREADS")
    command = ("" if threads is None else f"OMP_NUM_THREADS={threads} ") + \
        f"python -m bench.bench_opt_levels --rounds {rounds}"
    lines = [
        "## O0-O3 on a tiny transformer (CPU)", "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"load average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end; "
        f"date {date.today().isoformat()}; command `{command}`. "
        f"Model: {LAYERS}-layer transformer encoder, d_model {D_MODEL}, seq {SEQ}, batch {BATCH}, Adam "
        "(torch.optim.Adam; apexlite FusedAdam in L2 mode for the O2+FusedAdam rows).",
        "",
        "Every run goes once per round (rounds alternate their order); step ms is the median over rounds of "
        "each round's median step. The ratios are paired by round: the median of the per-round ratios of "
        "step times (above 1: slower) with its 95% sign-test interval (apexlite.sweep.intervals; 6 rounds "
        "or more give one).",
        "",
        "Bytes/param count model params + grads + fp32 masters + master grads + optimizer state between "
        "backward and step. O2 with a torch optimizer holds 20 B/param, 4 more than the 16 usually "
        "quoted: the fp32 master grads (4 B) exist next to the half model grads (2 B) until the step. "
        "O2 with FusedAdam holds 16 B/param: no fp32 grads, the kernel reads the half grads. "
        "Peak tensor KiB: tensors that live across steps (model, masters, optimizer state) plus the "
        "highest extra allocation during one step (activations, casts, grads, optimizer temporaries), "
        "read from torch.profiler's memory events.",
        "", "| run | step ms (median) | time vs O0 [95%] | time vs torch.autocast (same dtype) [95%] | "
        "peak tensor KiB in a step | bytes/param after backward |",
        "|---|---|---|---|---|---|",
    ]
    for key, res in results.items():
        dtype = key.rsplit(" ", 1)[1]
        o0, ac = results[f"O0 {dtype}"]["rounds"], results[f"autocast {dtype}"]["rounds"]
        b = "" if res["bytes"] != res["bytes"] else f"{res['bytes']:.1f}"
        lines.append(f"| {key} | {res['ms']:.2f} | {_versus(res['rounds'], o0)} | {_versus(res['rounds'], ac)} | "
                     f"{res['peak'] / 2 ** 10:.0f} | {b} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--write", metavar="FILE")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start_load = os.getloadavg()[0]
    results = run(args.rounds, args.steps)
    text = render(results, args.rounds, (start_load, os.getloadavg()[0]))
    log.info("%s", text)
    if args.write:
        replace_block(args.write, "opt-levels", text)


if __name__ == "__main__":
    main()
