"""GPU training-step figures for scripts/gpu_check.sh: O1 vs torch.autocast, and peak memory O0-O3.

A small transformer (4 encoder layers, d_model 512, 8 heads, sequence 256, batch 16, vocabulary
8192) trains with Adam; every variant gets its own copy of the model and optimizer, and the
variants are timed round by round (CUDA events, median over rounds). Peak memory is
``torch.cuda.max_memory_allocated`` over a few steps of each variant, started from an empty cache.
"""
from __future__ import annotations

import copy
import statistics
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from apexlite import amp
from apexlite.optimizers import FusedAdam
from bench.bench_opt_levels import TinyTransformer

D_MODEL, HEADS, LAYERS, SEQ, BATCH, VOCAB = 512, 8, 4, 256, 16, 8192
LOW_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _data() -> Tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=gen),
            torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda", generator=gen))


def _loss(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())


def autocast_step(base: torch.nn.Module, dtype: torch.dtype) -> Callable[[], None]:
    """torch's recipe: autocast around the forward, GradScaler for fp16."""
    model = copy.deepcopy(base)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
    tokens, targets = _data()

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype):
            loss = _loss(model, tokens, targets)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()

    return step


def apexlite_step(base: torch.nn.Module, level: str, dtype: torch.dtype, fused_adam: bool) -> Callable[[], None]:
    """One step of ``amp.initialize(opt_level=level)``; call ``amp.deinitialize()`` when done with it."""
    model = copy.deepcopy(base)
    opt = FusedAdam(model.parameters(), lr=1e-4, adam_w_mode=False) if fused_adam else \
        torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    model, opt = amp.initialize(model, opt, opt_level=level, dtype=dtype, verbosity=0)
    tokens, targets = _data()

    def step() -> None:
        with amp.scale_loss(_loss(model, tokens, targets), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()

    return step


def _time(step: Callable[[], None], steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def o1_vs_autocast(rounds: int, steps: int) -> Dict[str, Dict[str, float]]:
    """{dtype: {"autocast ms", "O1 ms", "O1 / autocast"}}; apexlite is initialized only around its own block."""
    torch.manual_seed(0)
    base = TinyTransformer(D_MODEL, HEADS, LAYERS, VOCAB).cuda()  # bench_opt_levels' model, GPU size
    results = {}
    for name, dtype in LOW_DTYPES.items():
        times: Dict[str, List[float]] = {"autocast": [], "O1": []}
        reference = autocast_step(base, dtype)
        for _ in range(3):
            reference()
        for index in range(rounds):
            order = ("autocast", "O1") if index % 2 == 0 else ("O1", "autocast")
            for variant in order:
                if variant == "autocast":
                    times[variant].append(_time(reference, steps))
                    continue
                step = apexlite_step(base, "O1", dtype, fused_adam=False)
                try:
                    step()
                    times[variant].append(_time(step, steps))
                finally:
                    amp.deinitialize()
        autocast_ms, o1_ms = statistics.median(times["autocast"]), statistics.median(times["O1"])
        results[name] = {"autocast ms": autocast_ms, "O1 ms": o1_ms, "O1 / autocast": o1_ms / autocast_ms}
    return results


def peak_memory(steps: int = 3) -> Dict[str, float]:
    """Peak MiB a variant allocates over a few steps (its model copy, optimizer state, activations, grads)."""
    torch.manual_seed(0)
    base = TinyTransformer(D_MODEL, HEADS, LAYERS, VOCAB).cuda()  # bench_opt_levels' model, GPU size
    variants = {"O0": ("O0", torch.bfloat16, False), "O1 bf16": ("O1", torch.bfloat16, False),
                "O2 bf16": ("O2", torch.bfloat16, False), "O2 bf16 + FusedAdam": ("O2", torch.bfloat16, True),
                "O3 bf16": ("O3", torch.bfloat16, False), "autocast bf16": None}
    results = {}
    for name, spec in variants.items():
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step = autocast_step(base, torch.bfloat16) if spec is None else apexlite_step(base, *spec)
        try:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            results[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
        finally:
            if spec is not None:
                amp.deinitialize()
        del step
    return results
