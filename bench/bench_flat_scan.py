"""The host cost of FusedAdam's per-step scans (apexlite._C.flat_grads, and flat_grads_in_place, the check
of a piece) and of its zero_grad pass, per param.

    python -m bench.bench_flat_scan [--members 2000 10000] [--calls 40] [--threads 1]
    valgrind --tool=callgrind --cache-sim=yes --toggle-collect='*flat_grads*' \\
        python -m bench.bench_flat_scan --members 20000 --calls 10 --untimed

Builds one flat buffer set of N tiny fp32 params (grads in the grad buffer, as after a step) and calls
the scans directly: ``warm`` back to back, ``cold`` after sweeping a 64 MB buffer (as a training step's
other work would), the piece check over all members as one piece, then zero_grad(set_to_none=False) the
same way. Reports ns per param (medians). The scan and the piece check look for kept grads in parts on the
intra-op threads (``--threads``); zero_grad's pass runs on one thread.
``--untimed`` only makes the calls, for callgrind: instructions and simulated cache misses per param
are its totals divided by members x (calls + 1) (the step that builds the set scans once too).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import List, Optional

import torch

from apexlite.optimizers import FusedAdam, _flat_grads


def _set_up(members: int):
    params = [torch.nn.Parameter(torch.randn(16)) for _ in range(members)]
    for param in params:
        param.grad = torch.randn(16)
    optimizer = FusedAdam(params, lr=1e-3)
    optimizer.step()  # builds the set and moves the grads into its buffer
    group = optimizer.param_groups[0]
    layout = optimizer._flat._layouts[id(group)][1]
    flat_set = layout.sets[0]
    args = (group["params"], layout.known, flat_set.members, flat_set.masters, flat_set.param_ptrs, flat_set.offsets,
            flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start)
    return optimizer, args


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads: the check of kept grads scans in parallel (0: torch's default)")
    parser.add_argument("--untimed", action="store_true", help="only call the scan (for callgrind)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    sweep = torch.zeros(64 << 20, dtype=torch.uint8)
    for members in args.members:
        optimizer, scan_args = _set_up(members)
        if args.untimed:
            for _ in range(args.calls):
                _flat_grads.flat_grads(*scan_args, 0)
            continue
        calls = {"scan": lambda: _flat_grads.flat_grads(*scan_args, 0),
                 "piece check": lambda: _flat_grads.flat_grads_in_place(*scan_args, 0, members, None),
                 "zero_grad": lambda: optimizer.zero_grad(set_to_none=False)}
        times = {f"{name} {clock}": [] for name in calls for clock in ("warm", "cold")}
        for _ in range(args.calls):
            for name, call in calls.items():
                sweep.add_(1)
                for clock in ("cold", "warm"):
                    start = time.perf_counter()
                    call()
                    times[f"{name} {clock}"].append(time.perf_counter() - start)
        print(f"{members} params, {torch.get_num_threads()} threads: " + ", ".join(f"{name} {statistics.median(values) / members * 1e9:.0f} ns"
                                                for name, values in times.items()) + " per param")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
