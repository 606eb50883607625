"""Training on a real GPU (marker ``cuda``; skipped without one; run by scripts/gpu_check.sh).

O0-O3 with FusedAdam against an fp32 torch AdamW run of the same model and data, and the host
synchronisations of a training step: apexlite's dynamic loss scaling reads its overflow flag at
most once per step, and FusedAdam under torch.amp.GradScaler adds none (counted with
``torch.cuda.set_sync_debug_mode("warn")``, which warns once per synchronising call).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from apexlite import amp
from apexlite.optimizers import FusedAdam

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = "cuda"
STEPS = 12
# opt level -> (low-precision dtype, rtol/atol of the final params against the fp32 run)
LEVELS = {
    "O0": (torch.float16, 1e-5),
    "O1-fp16": (torch.float16, 2e-2),
    "O1-bf16": (torch.bfloat16, 5e-2),
    "O2-fp16": (torch.float16, 2e-2),
    "O2-bf16": (torch.bfloat16, 5e-2),
    "O3-bf16": (torch.bfloat16, 1e-1),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 8)).to(DEVICE)


def _batches():
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    return [(torch.randn(16, 32, device=DEVICE, generator=gen), torch.randn(16, 8, device=DEVICE, generator=gen))
            for _ in range(STEPS)]


def _fp32_run():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for x, y in _batches():
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().float() for p in model.parameters()]


def _amp_step(model, opt, x, y, low):
    inputs = x.to(low) if next(model.parameters()).dtype is low else x
    with amp.scale_loss(torch.nn.functional.mse_loss(model(inputs).float(), y), opt) as scaled:
        scaled.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("level", list(LEVELS))
def test_opt_levels_on_cuda_track_fp32_training(level):
    low, tol = LEVELS[level]
    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level=level[:2], dtype=low, verbosity=0)
    try:
        for x, y in _batches():
            _amp_step(model, opt, x, y, low)
        trained = list(amp.master_params(opt)) if level.startswith("O2") else list(model.parameters())
        for ours, ref in zip(trained, _fp32_run()):
            torch.testing.assert_close(ours.detach().float(), ref, rtol=tol, atol=tol)
    finally:
        amp.deinitialize()


def _count_syncs(step, runs: int = 4) -> int:
    """Most host synchronisations seen in one call of ``step`` (after a warm-up call)."""
    step()
    torch.cuda.synchronize()
    most = 0
    previous = torch.cuda.get_sync_debug_mode()
    try:
        torch.cuda.set_sync_debug_mode("warn")
        for _ in range(runs):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                step()
            most = max(most, sum("synchronizing" in str(w.message) for w in seen))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return most


@pytest.mark.parametrize("level", ["O1-fp16", "O2-fp16", "O2-bf16"])
def test_dynamic_loss_scaling_syncs_at_most_once_per_step(level):
    low, _ = LEVELS[level]
    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level=level[:2], dtype=low, loss_scale="dynamic", verbosity=0)
    x, y = _batches()[0]
    try:
        assert _count_syncs(lambda: _amp_step(model, opt, x, y, low)) <= 1
    finally:
        amp.deinitialize()


def test_fused_adam_under_grad_scaler_adds_no_sync():
    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(DEVICE)
    x, y = _batches()[0]

    def step():
        with torch.autocast(DEVICE, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    assert _count_syncs(step) == 0


SHARED = {"tied through .data": (slice(0, 4096), slice(0, 4096)),
          "partly overlapping views": (slice(0, 40000), slice(8000, 48000))}


@pytest.mark.parametrize("flat_buffers", [True, False])
@pytest.mark.parametrize("sharing", list(SHARED))
def test_params_sharing_memory_step_one_after_the_other_on_cuda(sharing, flat_buffers):
    """Two params over one memory step one after the other, as torch's for-loop AdamW steps them: in one launch
    the blocks of both would run at once and one update would be lost."""
    def run(make_optimizer):
        torch.manual_seed(1)
        base = torch.randn(48000, device=DEVICE)
        params = [torch.nn.Parameter(torch.empty(0, device=DEVICE)) for _ in range(2)]
        for param, span in zip(params, SHARED[sharing]):
            param.data = base[span]
        optimizer = make_optimizer(params)
        gen = torch.Generator(device=DEVICE).manual_seed(2)
        for _ in range(3):
            for param in params:
                param.grad = torch.randn(param.shape, device=DEVICE, generator=gen)
            optimizer.step()
        return base

    reference = run(lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0, foreach=False))
    ours = run(lambda params: FusedAdam(params, lr=1e-2, flat_buffers=flat_buffers))
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)
