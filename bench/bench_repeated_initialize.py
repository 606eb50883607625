"""The cost of one `amp.initialize` + two steps, early and late in a process that calls it hundreds of times.

apex's test_multiple_models_optimizers_losses and opt-level loops build fresh models and optimizers and
call `amp.initialize` again each time. Each configuration here is that test's shape (three two-weight
models, two SGD optimizers, two losses, opt levels O0-O3 in turn); the configurations are timed in
windows, and the median of the last window is compared with the first: a ratio near 1 means a call
costs the same whatever came before. Usage:

    python -m bench.bench_repeated_initialize [--configurations 400] [--window 50] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import List

import torch

from apexlite import amp
from apexlite.amp.legacy_state import legacy_flags

LEVELS = ("O0", "O1", "O2", "O3")


class TwoWeights(torch.nn.Module):
    def __init__(self, unique: float, device: str) -> None:
        super().__init__()
        self.weight0 = torch.nn.Parameter(unique + torch.arange(2.0, device=device))
        self.weight1 = torch.nn.Parameter(1.0 + unique + torch.arange(2.0, device=device).half())

    def forward(self, x):
        return (x * self.weight0.float() * self.weight1.float()).sum()


def configuration(level: str, device: str) -> None:
    """apex's test_3models2losses2optimizers, one configuration without fault injection."""
    models = [TwoWeights(u, device) for u in (1.0, 2.0, 3.0)]
    first = torch.optim.SGD([{"params": models[0].parameters(), "lr": 0.25},
                             {"params": models[1].parameters(), "lr": 1.0}], momentum=0.5)
    second = torch.optim.SGD(models[2].parameters(), lr=0.5, momentum=0.25)
    legacy_flags.allow_incoming_model_not_fp32 = True
    try:
        models, (first, second) = amp.initialize(models, [first, second], opt_level=level, verbosity=0,
                                                 cast_model_type=False, num_losses=2)
    finally:
        legacy_flags.allow_incoming_model_not_fp32 = False
    x = torch.ones(2, device=device)
    for _ in range(2):
        loss0, loss1 = models[0](x) + models[1](x), models[2](x) + models[1](x)
        with amp.scale_loss(loss0, first, loss_id=0) as scaled:
            scaled.backward()
        with amp.scale_loss(loss1, [first, second], loss_id=1) as scaled:
            scaled.backward()
        first.step()
        second.step()
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configurations", type=int, default=400)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    times: List[float] = []
    try:
        for index in range(args.configurations):
            started = time.perf_counter()
            configuration(LEVELS[index % 4], args.device)
            times.append(time.perf_counter() - started)
    finally:
        amp.deinitialize()
    first = statistics.median(times[args.window:2 * args.window])  # the first window warms up
    last = statistics.median(times[-args.window:])
    print(f"| device | configurations | median ms, configurations {args.window}-{2 * args.window} | "
          f"median ms, last {args.window} | last / early |")
    print("|---|---|---|---|---|")
    print(f"| {args.device} | {args.configurations} | {first * 1e3:.2f} | {last * 1e3:.2f} | {last / first:.2f} |")


if __name__ == "__main__":
    main()
