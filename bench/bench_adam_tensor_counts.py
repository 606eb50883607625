"""FusedAdam's step against torch's fused and foreach AdamW from 1 to 10,000 tensors, beside a copy roofline.

    python -m bench.bench_adam_tensor_counts --device cpu --out bench_results/adam_counts --budget-s 240 [--threads 1]
    python -m bench.bench_adam_tensor_counts --device cuda --out gpu_check_results/adam_counts --budget-s 90

For each tensor count (the same total of fp32 params split evenly: 100M on CUDA, 4M on CPU by default;
then 1 and 2,000 tensors of 16 floats, where only host cost shows: a step's fixed cost and its cost per
tensor) every case is built in this one
process and the cases are timed round by round, interleaved, so drift hits them alike. Each step is
timed twice: ``wall``, from step() to the end of a synchronize after it (what a training loop waits
for), and on CUDA ``device``, between CUDA events recorded around it; ``host`` is the time until
step() returns. Reported: medians with the 10th-90th percentile spread, and FusedAdam's ratio to torch's
fused AdamW taken per round (the two steps ran back to back) so that load bursts cancel, with kept grads
and with fresh ones.

Cases (AdamW, lr 1e-3, weight decay 0.01, fp32):
* ``FusedAdam``: apexlite's, flat buffers, grads kept between steps (as after zero_grad(set_to_none=False)
  or while accumulating): after the first step they live in the grad buffer and nothing is copied;
* ``FusedAdam one check`` (CUDA only): the same, with every set checked in full before its one launch;
  ``FusedAdam`` steps a set of 1,000+ params (16M+ elements) in pieces, each launched once checked, so the
  device starts while the host checks the rest (NOTE [flat grads]; on the CPU there is nothing to overlap);
* ``FusedAdam fresh grads`` / ``torch fused fresh grads``: a new ``.grad`` tensor per param before every
  step, made outside the timing by a backward (autograd's grads, with no Python objects, as a model's
  backward leaves them; before 2026-11-28 they were assigned in Python), and the timing covers the step and then
  ``zero_grad(set_to_none=True)``: what an optimizer costs per iteration in torch's default loop. FusedAdam
  moves the first step's fresh grads into its grad buffer and, with its own kernels, reads the later
  ones where they are (NOTE [flat grads]; torch's fused ops, its fallback, move them every step); torch
  steps on them where they are. Either frees the grads in zero_grad, or in the step where they move, so
  the step and zero_grad are timed together;
* ``FusedAdam lists``: ``FusedAdam(flat_buffers=False)``, the per-tensor path (apexlite before flat buffers);
* ``torch fused`` / ``torch foreach``: ``torch.optim.AdamW(fused=True)`` / ``(foreach=True)``;
* ``copy roofline``: one device copy moving 28 bytes per param (read 14, write 14): an Adam step must
  read p, g, m, v and write p, m, v, so no step can beat it.
Writes ``results.md`` (tables) and ``results.json`` into ``--out``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from apexlite.optimizers import FusedAdam
from apexlite.optimizers._adam_step import resolve
from apexlite.optimizers._flat_runs import PiecePolicy

BYTES_PER_PARAM = 28
HYPER = dict(lr=1e-3, weight_decay=0.01)
DEFAULT_TOTAL = {"cuda": 100_000_000, "cpu": 4_000_000}
COUNTS = (1, 100, 1_000, 10_000)
HOST_CASES = ((1, 16), (2_000, 16))  # tensors x floats each
STEPS_PER_ROUND, MIN_ROUNDS, MAX_ROUNDS, WARMUP = 1, 10, 60, 2
ROOFLINE = "copy roofline"
CASES = ("FusedAdam", "FusedAdam one check", "FusedAdam fresh grads", "FusedAdam lists", "torch fused",
         "torch fused fresh grads", "torch foreach", ROOFLINE)  # "FusedAdam one check" on CUDA only
RATIOS = {"ratio_to_torch_fused": ("FusedAdam", "torch fused"),
          "fresh_ratio_to_torch_fused": ("FusedAdam fresh grads", "torch fused fresh grads")}


class Case:
    """One timed thing: ``step`` is timed; ``before`` runs first, untimed (fresh grads)."""

    def __init__(self, step: Callable[[], Any], before: Optional[Callable[[], None]] = None) -> None:
        self.step, self.before = step, before


def _params(sizes: List[int], device: str, seed: int = 0) -> List[torch.nn.Parameter]:
    gen = torch.Generator(device=device).manual_seed(seed)
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n, device=device, generator=gen))
        p.grad = torch.randn(n, device=device, generator=gen).mul_(1e-3)
        params.append(p)
    return params


def _fresh_grads(make: Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer], sizes: List[int],
                 device: str) -> Case:
    """step() then zero_grad(set_to_none=True), timed; before each, untimed, a backward that gives every
    param a new .grad (autograd's accumulator copies each source into a tensor of its own, with no Python
    object, as a model's backward does)."""
    params = _params(sizes, device)
    optimizer = make(params)
    sources = [p.grad.clone() for p in params]
    optimizer.zero_grad(set_to_none=True)

    def new_grads() -> None:
        torch.autograd.backward(params, grad_tensors=sources)

    def step_and_clear() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Case(step_and_clear, new_grads)


def build_cases(sizes: List[int], device: str) -> Dict[str, Case]:
    """Every case over its own params of ``sizes`` on ``device``."""
    cases: Dict[str, Case] = {}
    cases["FusedAdam"] = Case(FusedAdam(_params(sizes, device), **HYPER).step)
    if device == "cuda":
        whole = FusedAdam(_params(sizes, device), **HYPER)
        whole._flat.piece_policy = PiecePolicy(devices=())
        cases["FusedAdam one check"] = Case(whole.step)
    cases["FusedAdam fresh grads"] = _fresh_grads(lambda params: FusedAdam(params, **HYPER), sizes, device)
    cases["FusedAdam lists"] = Case(FusedAdam(_params(sizes, device), flat_buffers=False, **HYPER).step)
    cases["torch fused"] = Case(torch.optim.AdamW(_params(sizes, device), fused=True, **HYPER).step)
    cases["torch fused fresh grads"] = _fresh_grads(lambda params: torch.optim.AdamW(params, fused=True, **HYPER),
                                                    sizes, device)
    cases["torch foreach"] = Case(torch.optim.AdamW(_params(sizes, device), foreach=True, **HYPER).step)
    total = sum(sizes)
    source = torch.randn(total * BYTES_PER_PARAM // 8, device=device)  # 14 B read + 14 B written per param
    target = torch.empty_like(source)
    cases[ROOFLINE] = Case(lambda: target.copy_(source))
    return cases


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_step(case: Case, device: str) -> Tuple[float, float, Optional[float]]:
    """(wall, host, device) seconds of one step; device is None off CUDA."""
    if case.before is not None:
        case.before()
    _sync(device)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if device == "cuda" else None
    if events:
        events[0].record()
    start = time.perf_counter()
    case.step()
    returned = time.perf_counter()
    if events:
        events[1].record()
    _sync(device)
    end = time.perf_counter()
    on_device = events[0].elapsed_time(events[1]) / 1e3 if events else None
    return end - start, returned - start, on_device


def measure(cases: Dict[str, Case], device: str, budget_s: float) -> Dict[str, Dict[str, List[float]]]:
    """Samples per case and clock, cases interleaved round by round until the budget ends (MIN..MAX rounds).
    Each round starts one case further on, so that every case follows every other equally often: a case run
    right after one that left the caches full of its written lines pays their write-back."""
    for case in cases.values():
        for _ in range(WARMUP):
            time_step(case, device)
    samples = {name: {"wall": [], "host": [], "device": []} for name in cases}
    names = list(cases)
    start, rounds = time.perf_counter(), 0
    while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or time.perf_counter() - start < budget_s):
        for name in names[rounds % len(names):] + names[:rounds % len(names)]:
            case = cases[name]
            for _ in range(STEPS_PER_ROUND):
                wall, host, on_device = time_step(case, device)
                samples[name]["wall"].append(wall)
                samples[name]["host"].append(host)
                if on_device is not None:
                    samples[name]["device"].append(on_device)
        rounds += 1
    return samples


def _quantile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(values: List[float]) -> Optional[Dict[str, float]]:
    if not values:
        return None
    return {"median": statistics.median(values), "p10": _quantile(values, 0.1), "p90": _quantile(values, 0.9),
            "n": len(values)}


def paired_ratio(ours: List[float], theirs: List[float]) -> Optional[Dict[str, float]]:
    """Per round, our step over the neighbouring step of the other case: drift and load bursts that
    hit both cancel out (the samples of one round were taken back to back)."""
    return summarise([a / b for a, b in zip(ours, theirs)])


def tensor_rows(device: str, total: int) -> List[Tuple[str, List[int]]]:
    """(label, sizes) per row: ``total`` params split into COUNTS tensors, then the host-cost rows."""
    rows = [(f"{count:,} x {total // count:,}", [total // count] * count) for count in COUNTS]
    return rows + [(f"{count:,} x {size}", [size] * count) for count, size in HOST_CASES]


def run(device: str, total: int, budget_s: float) -> Dict[str, Any]:
    rows = tensor_rows(device, total)
    results = []
    for label, sizes in rows:
        cases = build_cases(sizes, device)
        samples = measure(cases, device, budget_s / len(rows))
        results.append({"tensors": len(sizes), "label": label, "params": sum(sizes),
                        "cases": {name: {clock: summarise(values) for clock, values in clocks.items()}
                                  for name, clocks in samples.items()},
                        **{key: {clock: paired_ratio(samples[ours][clock], samples[theirs][clock])
                                 for clock in samples[ours]} for key, (ours, theirs) in RATIOS.items()}})
        del cases
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"rows": results}


def environment(device: str) -> Dict[str, Any]:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "fused_adam_path": resolve("auto", torch.device(device))}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _cell(stats: Optional[Dict[str, float]]) -> str:
    if stats is None:
        return "n/a"
    return f"{stats['median'] * 1e3:.3g} ({stats['p10'] * 1e3:.3g}-{stats['p90'] * 1e3:.3g})"


def _ratio_cell(ratio: Optional[Dict[str, float]]) -> str:
    return "n/a" if ratio is None else f"{ratio['median']:.2f} ({ratio['p10']:.2f}-{ratio['p90']:.2f})"


def render(report: Dict[str, Any], clock: str) -> str:
    names = [name for name in CASES if any(name in row["cases"] for row in report["rows"])]
    lines = [f"**{clock}** ms per step, median (p10-p90); the ratios: median (p10-p90) of the per-round ratios "
             "(fresh grads: step + zero_grad each)", "",
             "| tensors x params | " + " | ".join(names) + " | FusedAdam / torch fused | fresh grads: FusedAdam / "
             "torch fused | FusedAdam % of roofline |",
             "|---|" + "---:|" * (len(names) + 3)]
    for row in report["rows"]:
        cases = row["cases"]
        if row["ratio_to_torch_fused"][clock] is None:
            continue
        roof, ours = cases[ROOFLINE][clock]["median"], cases["FusedAdam"][clock]["median"]
        cells = [_cell(cases[name][clock]) for name in names] + [_ratio_cell(row[key][clock]) for key in RATIOS]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + f" | {100 * roof / ours:.0f}% |")
    return "\n".join(lines)


def parse_arguments(description: str, out: str, budget_s: float, argv: Optional[List[str]]) -> argparse.Namespace:
    """The options this benchmark and bench_zero_grad share; sets the thread count it asks for."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=out, help="folder for results.md/.json")
    parser.add_argument("--budget-s", type=float, default=budget_s, help="timing budget for all rows together")
    parser.add_argument("--total", type=int, default=None, help="fp32 params per case (default: 100M CUDA, 4M CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA device; run with --device cpu")
    return args


def write_results(folder: str, report: Dict[str, Any], text: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(text + "\n")
    print(text)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(__doc__.splitlines()[0], "bench_results/adam_tensor_counts", 90.0, argv)
    torch.manual_seed(0)
    env = environment(args.device)
    report = run(args.device, args.total or DEFAULT_TOTAL[args.device], args.budget_s)
    report["environment"] = dict(env, load_average_end=os.getloadavg())
    report["command"] = "python -m bench.bench_adam_tensor_counts " + " ".join(argv if argv is not None else os.sys.argv[1:])
    clocks = ["wall", "host"] + (["device"] if args.device == "cuda" else [])
    text = "\n\n".join([f"{env['date']}, torch {env['torch']}, {env.get('gpu', env['machine'])}, "
                        f"{env['threads']} threads, FusedAdam path: {env['fused_adam_path']}, load average "
                        f"{env['load_average'][0]:.2f} -> {report['environment']['load_average_end'][0]:.2f}"]
                       + [render(report, clock) for clock in clocks])
    write_results(args.out, report, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
