"""The cost of moving a model while O1 is installed (apexlite/amp/o1/device_scope.py re-reads the device scope
after each outermost `Module._apply`: `to`, `cuda`, `half`, `float`, ...).

Times `model.to(torch.float32)` (an `_apply` over every module, with nothing to convert) of a model of
`--layers` Linear layers, three ways in one process, interleaved round by round: without amp, with O1 installed
for another model, and with the model itself registered with O1. Medians in ms. Usage:

    python -m bench.bench_module_moves [--layers 2000] [--rounds 7] [--calls 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch

from apexlite import amp


def timed(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e3


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args(argv)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(args.layers)])
    other = torch.nn.Linear(4, 4)
    move = lambda: model.to(torch.float32)  # noqa: E731
    results: Dict[str, List[float]] = {"without amp": [], "O1, another model registered": [],
                                       "O1, this model registered": []}
    for _ in range(args.rounds):
        results["without amp"].append(timed(move, args.calls))
        for name, registered in (("O1, another model registered", other), ("O1, this model registered", model)):
            amp.initialize(registered, opt_level="O1", dtype=torch.bfloat16, verbosity=0)
            try:
                results[name].append(timed(move, args.calls))
            finally:
                amp.deinitialize()
    base = statistics.median(results["without amp"])
    print(f"`model.to(torch.float32)` of {args.layers} Linear layers, torch {torch.__version__}, median ms "
          f"of {args.rounds} rounds x {args.calls} calls:\n")
    print("| case | ms | / without amp |\n|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(values) / base:.2f} |")


if __name__ == "__main__":
    main()
