"""FusedAdam's zero_grad against torch's fused AdamW's, from 1 to 10,000 tensors, both clearing modes.

    python -m bench.bench_zero_grad --device cpu --out bench_results/zero_grad --budget-s 120 [--threads 1]
    python -m bench.bench_zero_grad --device cuda --out gpu_check_results/zero_grad --budget-s 40

zero_grad is the other per-iteration optimizer call: torch's is a Python loop over the params, so its
host cost grows with the tensor count as a per-tensor step does. Each round, for every case: fresh
grads and a step (untimed, so the grads are where a training loop has them), then zero_grad timed as
bench_adam_tensor_counts times a step (``wall`` to the end of a synchronize, ``host`` until it returns).
Cases are interleaved round by round in one process; FusedAdam's ratio to torch's is taken per round.
Writes ``results.md`` and ``results.json`` into ``--out``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from apexlite.optimizers import FusedAdam
from bench.bench_adam_tensor_counts import (DEFAULT_TOTAL, HYPER, Case, _cell, _params, tensor_rows,
                                            environment, measure, paired_ratio, parse_arguments, summarise,
                                            write_results)

CASES = ("FusedAdam set_to_none", "torch fused set_to_none", "FusedAdam kept", "torch fused kept")


def _case(optimizer: torch.optim.Optimizer, params: List[torch.nn.Parameter], set_to_none: bool) -> Case:
    sources = [p.detach().clone() for p in params]

    def before() -> None:
        for param, source in zip(params, sources):
            param.grad = source.clone()
        optimizer.step()

    clear: Callable[[], None] = lambda: optimizer.zero_grad(set_to_none=set_to_none)  # noqa: E731
    return Case(clear, before)


def build_cases(sizes: List[int], device: str) -> Dict[str, Case]:
    cases = {}
    for name in CASES:
        params = _params(sizes, device)
        optimizer = FusedAdam(params, **HYPER) if name.startswith("FusedAdam") else \
            torch.optim.AdamW(params, fused=True, **HYPER)
        cases[name] = _case(optimizer, params, name.endswith("set_to_none"))
    return cases


def run(device: str, total: int, budget_s: float) -> Dict[str, Any]:
    rows = tensor_rows(device, total)
    results = []
    for label, sizes in rows:
        samples = measure(build_cases(sizes, device), device, budget_s / len(rows))
        results.append({"label": label, "tensors": len(sizes),
                        "cases": {name: {clock: summarise(values) for clock, values in clocks.items()}
                                  for name, clocks in samples.items()},
                        "ratios": {mode: paired_ratio(samples[f"FusedAdam {mode}"]["wall"],
                                                      samples[f"torch fused {mode}"]["wall"])
                                   for mode in ("set_to_none", "kept")}})
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"rows": results}


def render(report: Dict[str, Any]) -> str:
    lines = ["**wall** ms per zero_grad, median (p10-p90); ratios: median (p10-p90) of per-round FusedAdam / torch",
             "", "| tensors x params | " + " | ".join(CASES) + " | ratio set_to_none | ratio kept |",
             "|---|" + "---:|" * (len(CASES) + 2)]
    for row in report["rows"]:
        ratios = [row["ratios"][mode] for mode in ("set_to_none", "kept")]
        lines.append(f"| {row['label']} | " + " | ".join(_cell(row["cases"][name]["wall"]) for name in CASES) + " | "
                     + " | ".join(f"{r['median']:.2f} ({r['p10']:.2f}-{r['p90']:.2f})" for r in ratios) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_arguments(__doc__.splitlines()[0], "bench_results/zero_grad", 60.0, argv)
    report = {"environment": environment(args.device),
              **run(args.device, args.total or DEFAULT_TOTAL[args.device], args.budget_s)}
    env = report["environment"]
    write_results(args.out, report, f"{env['date']}, torch {env['torch']}, {env.get('gpu', env['machine'])}, "
                                    f"{env['threads']} threads, load average {env['load_average'][0]:.2f}\n\n{render(report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
