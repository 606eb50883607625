"""FusedAdam against torch's Adam on this machine: medians of interleaved steps, side by side.

Cases (same sizes, all alive in one process, timed round-robin so drift hits them alike):

* ``torch Adam fused``     torch.optim.Adam(fused=True) on fp32 params and grads (the baseline);
* ``torch Adam foreach``   torch.optim.Adam(foreach=True), fp32;
* ``apexlite fp32 [path]`` FusedAdam on fp32 params and grads, for each path this machine has:
                           ``kernel`` (apexlite's compiled kernel) and ``torch ops`` (torch's fused
                           Adam, the path without a compiled kernel, e.g. APEXLITE_DISABLE_EXTENSION=1);
* ``torch O2 chain``       bf16 model params and grads, fp32 masters: copy grads to fp32, fused
                           Adam on the masters, copy the masters back to bf16 (three passes);
* ``apexlite O2 [path]``   FusedAdam(master_weights=True) on bf16 params with bf16 grads: the kernel
                           reads bf16 grads and writes fp32 masters, moments and the bf16 copy in one
                           pass; the torch-ops path runs the chain in cache-sized slices;
* ``apexlite reference``   FusedAdam(implementation="reference"), the pure-torch oracle.

Effective GB/s counts the bytes the fused step must move at least: fp32 reads p, g, m, v and writes
p, m, v (28 B/param); O2 reads master, bf16 g, m, v and writes master, m, v, bf16 copy (28 B/param).
Copy bandwidth is ``dst.copy_(src)`` on one fp32 tensor of the same total size, timed in the same
round-robin (read + write bytes / time).

    python bench/bench_fused_adam.py                  # 10M and 50M params in ~100 tensors
    python bench/bench_fused_adam.py --sizes 1e6 --repeats 5
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch

from apexlite._native import loader
from apexlite.optimizers import FusedAdam, _torch_fused

BYTES_PER_PARAM = 28
NUM_TENSORS = 100
COPY_CASE = "fp32 copy"


def tensor_sizes(total: int, count: int = NUM_TENSORS) -> List[int]:
    """``count`` sizes summing to ``total``, from small to large (like the layers of a model)."""
    weights = [1 + (i % 10) for i in range(count)]
    sizes = [total * w // sum(weights) for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def make_params(sizes: List[int], dtype: torch.dtype) -> List[torch.nn.Parameter]:
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n).to(dtype))
        p.grad = torch.randn(n).mul_(1e-3).to(dtype)
        params.append(p)
    return params


def torch_o2_chain(sizes: List[int]) -> Callable[[], None]:
    """The three-pass O2 step torch offers: upcast grads, fused Adam on masters, copy back."""
    model = make_params(sizes, torch.bfloat16)
    masters = [torch.nn.Parameter(p.detach().float()) for p in model]
    for m in masters:
        m.grad = torch.empty_like(m)
    opt = torch.optim.Adam(masters, lr=1e-3, fused=True)
    model_grads = [p.grad for p in model]
    master_grads = [m.grad for m in masters]
    model_data = [p.detach() for p in model]
    master_data = [m.detach() for m in masters]

    def step() -> None:
        torch._foreach_copy_(master_grads, model_grads)
        opt.step()
        torch._foreach_copy_(model_data, master_data)

    return step


PATHS = {"kernel": "kernel", "torch": "torch ops"}


def available_paths() -> List[str]:
    """FusedAdam implementations this process can run on the CPU."""
    return [path for path, ok in (("kernel", loader.kernels_available("cpu")), ("torch", _torch_fused.available("cpu")))
            if ok]


def build_cases(total: int, with_reference: bool) -> Dict[str, Callable[[], None]]:
    sizes = tensor_sizes(total)
    cases = {
        "torch Adam fused": torch.optim.Adam(make_params(sizes, torch.float32), lr=1e-3, fused=True).step,
        "torch Adam foreach": torch.optim.Adam(make_params(sizes, torch.float32), lr=1e-3, foreach=True).step,
        "torch O2 chain": torch_o2_chain(sizes),
    }
    for path in available_paths():
        cases[f"apexlite fp32 [{PATHS[path]}]"] = FusedAdam(make_params(sizes, torch.float32), lr=1e-3,
                                                            implementation=path).step
        cases[f"apexlite O2 [{PATHS[path]}]"] = FusedAdam(make_params(sizes, torch.bfloat16), lr=1e-3,
                                                          master_weights=True, implementation=path).step
    if with_reference:
        cases["apexlite reference"] = FusedAdam(make_params(sizes, torch.float32), lr=1e-3,
                                                implementation="reference").step
    return cases


def copy_case(total: int) -> Callable[[], None]:
    """An fp32 copy of ``total`` elements (timed with the other cases, for the bandwidth reference)."""
    src, dst = torch.randn(total), torch.empty(total)
    return lambda: dst.copy_(src)


def time_cases(cases: Dict[str, Callable[[], None]], repeats: int, warmup: int = 3) -> Dict[str, float]:
    """Median seconds per step of each case, measured round-robin."""
    for step in cases.values():
        for _ in range(warmup):
            step()
    samples: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, step in cases.items():
            start = time.perf_counter()
            step()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def report(total: int, medians: Dict[str, float]) -> str:
    bandwidth = 8 * total / medians.pop(COPY_CASE) / 1e9
    base = medians["torch Adam fused"]
    chain = medians["torch O2 chain"]
    lines = [
        f"**{total / 1e6:g}M params in {NUM_TENSORS} tensors** (copy bandwidth {bandwidth:.1f} GB/s)",
        "",
        "| case | median ms/step | vs torch Adam fused | vs torch O2 chain | effective GB/s | % of copy bw |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, seconds in medians.items():
        gbps = BYTES_PER_PARAM * total / seconds / 1e9
        lines.append(f"| {name} | {seconds * 1e3:.2f} | {seconds / base:.2f}x | {seconds / chain:.2f}x | "
                     f"{gbps:.1f} | {100 * gbps / bandwidth:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[10e6, 50e6], help="total params per run")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per case")
    parser.add_argument("--reference", action="store_true", help="also time the pure-torch fallback")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, compiled kernel: {loader.status().source}, "
          f"paths: {', '.join(PATHS[p] for p in available_paths())}\n")
    for total in (int(s) for s in args.sizes):
        cases = build_cases(total, args.reference)
        cases[COPY_CASE] = copy_case(total)
        print(report(total, time_cases(cases, args.repeats)) + "\n")
        del cases


if __name__ == "__main__":
    main()
