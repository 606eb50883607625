"""O1 benchmark: per-call host cost of patched ops and training-step time, against torch.autocast and
fp32, for both O1 cast paths (pure Python and apexlite._C).

    python -m bench.bench_o1 [--rounds 15] [--steps 10] [--threads 1] [--write BENCHMARKS.md]

Every variant runs side by side in one process, interleaved round by round; figures are medians.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import platform
import statistics
import time
from datetime import date
from typing import Any, Callable, Dict, Iterator, List

import torch
import torch.nn.functional as F

from apexlite import amp
from apexlite.amp.o1 import native_casts
from apexlite.amp.session import current_session
from bench.report import replace_block

log = logging.getLogger("bench.o1")

CASES = {
    # name: (dtype, model factory, input factory, dynamic loss scaling)
    "compute-bound MLP (bf16, 1024 wide, batch 256)": (torch.bfloat16, "mlp", (1024, 1024, 4, 256), False),
    "overhead-bound tiny MLP (bf16, 16 layers of 32, batch 8)": (torch.bfloat16, "mlp", (32, 32, 16, 8), False),
    "fp16 + dynamic loss scaling (64 wide, batch 64)": (torch.float16, "mlp", (64, 64, 3, 64), True),
    "launch-bound transformer (bf16, 4 layers, width 64, seq 32, batch 4)": (torch.bfloat16, "transformer",
                                                                             (64, 4, 32, 4), False),
}
PATHS = ("python", "native")  # O1 cast paths: the pure-Python wrappers (before) and apexlite._C's (after)


@contextlib.contextmanager
def cast_path(path: str) -> Iterator[None]:
    """Sessions created inside choose the given O1 cast path."""
    chosen = native_casts.use_native
    native_casts.use_native = lambda: path == "native"
    try:
        yield
    finally:
        native_casts.use_native = chosen


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


class SmallTransformer(torch.nn.Module):
    """A launch-bound step: many small ops, each costing host time rather than arithmetic."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).mean(dim=1)


def build(kind: str, shape: tuple):
    """(model, input, target) for a case."""
    if kind == "mlp":
        features, hidden, layers, batch = shape
        return make_mlp(features, hidden, layers), torch.randn(batch, features), torch.randn(batch, 1)
    width, layers, seq, batch = shape
    return SmallTransformer(width, layers), torch.randn(batch, seq, width), torch.randn(batch, 1)


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


def run_case(name: str, spec, rounds: int, steps: int) -> Dict[str, Any]:
    dtype, kind, shape, dynamic = spec
    torch.manual_seed(0)
    model, x, y = build(kind, shape)
    blocks = {key: (lambda fn=fn: timed(fn, steps)) for key, fn in step_fns(model, x, y, dtype, dynamic).items()}
    loss_scale = "dynamic" if dynamic else 1.0
    for path in PATHS:
        apex_model = copy.deepcopy(model)
        apex_opt = torch.optim.SGD(apex_model.parameters(), lr=1e-3)

        def apexlite_step(apex_model=apex_model, apex_opt=apex_opt):
            loss = F.mse_loss(apex_model(x).float(), y)
            with amp.scale_loss(loss, apex_opt) as scaled:
                scaled.backward()
            apex_opt.step()
            apex_opt.zero_grad()

        def apexlite_block(path=path, apex_model=apex_model, apex_opt=apex_opt, step=apexlite_step) -> float:
            with cast_path(path):
                amp.initialize(apex_model, apex_opt, opt_level="O1", dtype=dtype, loss_scale=loss_scale, verbosity=0)
            try:
                return timed(step, steps)
            finally:
                amp.deinitialize()

        blocks[f"O1 {path}"] = apexlite_block
    results: Dict[str, List[float]] = {key: [] for key in blocks}
    order = list(blocks)
    for round_index in range(rounds):
        # alternate the order every round so no variant always runs first or last (drift, turbo)
        for key in (order if round_index % 2 == 0 else order[::-1]):
            results[key].append(blocks[key]())
    medians = {key: statistics.median(values) for key, values in results.items()}
    # each round's O1 native / autocast: paired within seconds, so load that drifts between rounds cancels
    autocast = results[next(k for k in results if k.startswith("torch.autocast"))]
    paired = sorted(native / base for native, base in zip(results["O1 native"], autocast))
    medians["paired native / autocast"] = (statistics.median(paired), paired[0], paired[-1])
    return medians


def per_call_costs(rounds: int) -> Dict[str, Dict[str, float]]:
    """Microseconds per call on tiny (8x8) fp32 inputs, bf16 target, weights served from the cache (the
    weight belongs to the model passed to initialize: the cache holds only registered weights' casts
    between calls, see cache.py's NOTE [cast cache lifetime])."""
    owner = torch.nn.Linear(8, 8, bias=False)
    w = owner.weight
    x, y, low = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8).bfloat16()
    calls = {"F.linear": lambda: F.linear(x, w), "torch.mm": lambda: torch.mm(x, w),
             "F.softmax (fp32 in, nothing to cast)": lambda: F.softmax(x, dim=1),
             "Tensor.matmul": lambda: x.matmul(w), "torch.addcmul (promote)": lambda: torch.addcmul(x, low, y)}
    out: Dict[str, Dict[str, List[float]]] = {label: {} for label in calls}
    for round_index in range(rounds):
        for label, fn in calls.items():
            def loop(fn=fn):
                for _ in range(200):
                    fn()
            samples = out[label]
            samples.setdefault("unpatched", []).append(timed(loop, 5) / 200)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                samples.setdefault("torch.autocast", []).append(timed(loop, 5) / 200)
            for path in (PATHS if round_index % 2 == 0 else PATHS[::-1]):
                with cast_path(path):
                    amp.initialize(owner, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
                try:
                    samples.setdefault(f"O1 {path}", []).append(timed(loop, 5) / 200)
                    if path == "native":  # the floor of any wrapt-held wrapper: patched, but passing through
                        current_session().cast_state.active = False
                        samples.setdefault("wrapt floor", []).append(timed(loop, 5) / 200)
                finally:
                    amp.deinitialize()
    return {label: {key: statistics.median(v) * 1e6 for key, v in samples.items()} for label, samples in out.items()}


def render(case_results: Dict[str, Dict[str, float]], calls: Dict[str, Dict[str, float]], rounds: int,
           steps: int) -> str:
    lines = [
        "## O1 vs torch.autocast (CPU)", "",
        "Each round times every variant in its own block, in an order that alternates between rounds; "
        "apexlite is initialized before and deinitialized after its block, so the other variants run on "
        "unpatched torch. `O1 python` is the pure-Python cast path (what O1 ran before its hot path moved "
        "to C++, and what runs without the extension); `O1 native` is apexlite._C's.", "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
        f"date {date.today().isoformat()}; load average {os.getloadavg()[0]:.1f} at the end; command "
        f"`python -m bench.bench_o1 --rounds {rounds} --steps {steps}`.",
        "", "Per call, tiny (8x8) fp32 inputs, bf16 target, weights from the cast cache (median µs):", "",
        "| call | unpatched | torch.autocast | O1 python | O1 native | native / autocast | wrapt floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in calls.items():
        lines.append(f"| `{label}` | {r['unpatched']:.2f} | {r['torch.autocast']:.2f} | {r['O1 python']:.2f} | "
                     f"{r['O1 native']:.2f} | {r['O1 native'] / r['torch.autocast']:.2f} | {r['wrapt floor']:.2f} |")
    lines += ["", "`wrapt floor`: the same patched call with the session's casts switched off, so the native "
              "wrapper passes straight through: what wrapt's FunctionWrapper itself costs (a Tensor method "
              "is bound per attribute access; a Python function such as F.softmax is re-called with a "
              "kwargs dict and itself calls the patched Tensor.softmax)."]
    lines += ["", "Training step (median ms per step; ratios against torch.autocast):", "",
              "| case | fp32 | torch.autocast | O1 python | O1 native | python / autocast | native / autocast "
              "| native / autocast per round: median (min-max) |",
              "|---|---|---|---|---|---|---|---|"]
    for case, res in case_results.items():
        autocast = res[next(k for k in res if k.startswith("torch.autocast"))]
        paired, low, high = res["paired native / autocast"]
        lines.append(f"| {case} | {res['fp32'] * 1e3:.3f} | {autocast * 1e3:.3f} | {res['O1 python'] * 1e3:.3f} | "
                     f"{res['O1 native'] * 1e3:.3f} | {res['O1 python'] / autocast:.3f} | "
                     f"{res['O1 native'] / autocast:.3f} | {paired:.3f} ({low:.3f}-{high:.3f}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: host cost per op)")
    parser.add_argument("--write", metavar="FILE", help="replace the o1 block of this markdown file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    if not native_casts.use_native():
        raise SystemExit(f"bench_o1 compares both O1 cast paths; the native one is unavailable: {native_casts.status()}")
    calls = per_call_costs(args.rounds)
    case_results = {name: run_case(name, spec, args.rounds, args.steps) for name, spec in CASES.items()}
    text = render(case_results, calls, args.rounds, args.steps)
    log.info("%s", text)
    if args.write:
        replace_block(args.write, "o1", text)


if __name__ == "__main__":
    main()
