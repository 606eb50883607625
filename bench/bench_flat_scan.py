"""The host cost of FusedAdam's per-step scans (apexlite._C.flat_grads, and flat_grads_in_place, the check
of a piece) and of its zero_grad pass, per param.

    python -m bench.bench_flat_scan [--members 2000 10000] [--calls 40] [--threads 1] [--busy 1]
    valgrind --tool=callgrind --cache-sim=yes --toggle-collect='*flat_grads*' \\
        python -m bench.bench_flat_scan --members 20000 --calls 10 --untimed

Builds one flat buffer set of N tiny fp32 params (grads in the grad buffer, as after a step) and calls
the scans directly: ``warm`` back to back, ``cold`` after sweeping a 64 MB buffer (as a training step's
other work would), the piece check over all members as one piece, then zero_grad(set_to_none=False) the
same way. Reports ns per param: medians, and the 90th percentile in brackets. ``--busy K`` keeps K processes
spinning beside the calls, as a data loader's workers keep cores busy: the scans run on the calling thread,
so their tail stays near their median (a parallel version ended at a barrier for all its threads, and a
thread the scheduler did not run in time stalled a call by milliseconds: member_scan.h). ``--threads`` sets
torch's intra-op threads (the fill of zero_grad uses them; the scans do not).
``--untimed`` only makes the calls, for callgrind: instructions and simulated cache misses per param
are its totals divided by members x (calls + 1) (the step that builds the set scans once too).
"""
from __future__ import annotations

import argparse
import multiprocessing
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
    args = (group["params"], layout.known, flat_set.members, flat_set.masters, flat_set.param_spans, flat_set.offsets,
            flat_set.grad_like, flat_set.weights.numel(), flat_set.grad_start)
    return optimizer, args


def _spin(stop) -> None:
    """A busy process: keeps one core occupied until told to stop."""
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _percentile(values: List[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads (0: torch's default)")
    parser.add_argument("--untimed", action="store_true", help="only call the scan (for callgrind)")
    parser.add_argument("--busy", type=int, default=0, help="processes kept spinning beside the calls")
    args = parser.parse_args(argv)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    try:
        return _run(args)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()


def _run(args: argparse.Namespace) -> int:
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
        print(f"{members} params, {torch.get_num_threads()} threads, {args.busy} busy processes: " + ", ".join(
            f"{name} {statistics.median(values) / members * 1e9:.0f} ({_percentile(values, 0.9) / members * 1e9:.0f})"
            for name, values in times.items()) + " ns per param, median (p90)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
