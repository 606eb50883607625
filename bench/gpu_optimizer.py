"""GPU optimizer-step figures for scripts/gpu_check.sh: FusedAdam against torch's fused Adam, and O2 steps.

Every case is timed with CUDA events (median of steps after warm-up), cases interleaved round by
round. Achieved bandwidth is the bytes a step must move divided by its time: fp32 Adam reads p, g,
m, v and writes p, m, v (28 B/param); the O2 step reads the fp32 master, bf16 grad, m, v and writes
master, m, v and the bf16 weight (28 B/param; torch's three-pass chain moves more for the same
work). Peak bandwidth comes from the device's memory clock and bus width when torch reports them,
else from a table of datasheet figures.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Optional

import torch

from apexlite._native import loader
from apexlite.optimizers import FusedAdam

BYTES_PER_PARAM = 28
NUM_TENSORS = 100
# datasheet HBM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name(), most specific first
PEAK_BANDWIDTH = (
    ("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
    ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12),
    ("L40S", 0.864e12), ("L4", 0.3e12), ("A10", 0.6e12), ("V100", 0.9e12),
)


def peak_bandwidth() -> Optional[float]:
    """The device's peak memory bandwidth in bytes/s (2 transfers per memory clock), or None if unknown."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2.0 * clock_khz * 1e3 * bus_bits / 8
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_BANDWIDTH if key in name), None)


def tensor_sizes(total: int, count: int = NUM_TENSORS) -> List[int]:
    """``count`` sizes summing to ``total``, small to large, like the layers of a model."""
    weights = [1 + (i % 10) for i in range(count)]
    sizes = [total * w // sum(weights) for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _params(sizes: List[int], dtype: torch.dtype) -> List[torch.nn.Parameter]:
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n, device="cuda").to(dtype))
        p.grad = (torch.randn(n, device="cuda") * 1e-3).to(dtype)
        params.append(p)
    return params


def _o2_chain(sizes: List[int]) -> Callable[[], None]:
    """torch's O2 step by hand: upcast bf16 grads, fused AdamW on fp32 masters, copy masters to bf16."""
    model = _params(sizes, torch.bfloat16)
    masters = [torch.nn.Parameter(p.detach().float()) for p in model]
    for m in masters:
        m.grad = torch.empty_like(m)
    opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.0, fused=True)
    model_grads, master_grads = [p.grad for p in model], [m.grad for m in masters]
    model_data, master_data = [p.detach() for p in model], [m.detach() for m in masters]

    def step() -> None:
        torch._foreach_copy_(master_grads, model_grads)
        opt.step()
        torch._foreach_copy_(model_data, master_data)

    return step


def cases(total: int) -> Dict[str, Callable[[], None]]:
    """The timed steps at ``total`` params (apexlite's kernel rows only when it is built)."""
    sizes = tensor_sizes(total)
    found = {
        "torch AdamW fused (fp32)": torch.optim.AdamW(_params(sizes, torch.float32), lr=1e-3, weight_decay=0.0,
                                                      fused=True).step,
        "apexlite FusedAdam, torch path (fp32)": FusedAdam(_params(sizes, torch.float32), lr=1e-3,
                                                           implementation="torch").step,
        "torch O2 chain (bf16 + fp32 masters)": _o2_chain(sizes),
        "apexlite O2, torch path": FusedAdam(_params(sizes, torch.bfloat16), lr=1e-3, master_weights=True,
                                             implementation="torch").step,
    }
    if loader.kernels_available("cuda"):
        found["apexlite FusedAdam kernel (fp32)"] = FusedAdam(_params(sizes, torch.float32), lr=1e-3,
                                                              implementation="kernel").step
        found["apexlite O2 kernel"] = FusedAdam(_params(sizes, torch.bfloat16), lr=1e-3, master_weights=True,
                                                implementation="kernel").step
    return found


def time_cases(steps: Dict[str, Callable[[], None]], rounds: int, per_round: int = 5) -> Dict[str, float]:
    """Median seconds per step of each case, CUDA-event timed, interleaved round by round."""
    samples: Dict[str, List[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(3):
            step()
    for _ in range(rounds):
        for name, step in steps.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_round):
                step()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / per_round)
    return {name: statistics.median(values) for name, values in samples.items()}


def run(totals: List[int], rounds: int) -> Dict[str, dict]:
    """{"peak_bandwidth_GBps": peak used, "sizes": {"<N>M params": {case: {"ms", "GB/s", "% of peak", "vs torch"}}}}."""
    peak = peak_bandwidth()
    sizes: Dict[str, dict] = {}
    for total in totals:
        medians = time_cases(cases(total), rounds)
        fp32_base = medians["torch AdamW fused (fp32)"]
        o2_base = medians["torch O2 chain (bf16 + fp32 masters)"]
        rows = {}
        for name, seconds in medians.items():
            achieved = BYTES_PER_PARAM * total / seconds
            base = o2_base if "O2" in name else fp32_base
            rows[name] = {"ms": seconds * 1e3, "GB/s": achieved / 1e9, "vs torch": seconds / base,
                          "% of peak": None if peak is None else 100 * achieved / peak}
        sizes[f"{total / 1e6:g}M params"] = rows
        torch.cuda.empty_cache()
    return {"peak_bandwidth_GBps": None if peak is None else peak / 1e9, "sizes": sizes}
