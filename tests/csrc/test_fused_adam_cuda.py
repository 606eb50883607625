"""FusedAdam on a real GPU (marker ``cuda``; skipped without one; run by scripts/gpu_check.sh).

The CUDA kernel against the CPU kernel bit for bit (both builds keep every float operation as
written: -ffp-contract=off, nvcc --fmad=false) and against the pure-torch reference; the packing
cases of the host emulation tests on the device; torch's fused path on CUDA; and no host
synchronisation in any FusedAdam step (``torch.cuda.set_sync_debug_mode("error")``).
"""
from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam, _torch_fused
from apexlite.optimizers._reference import reference_adam_step
from tests._helpers.tolerances import dtype_tols
from tests.csrc.test_fused_adam_cuda_host import (
    COUNTING, PACKING_CASES, _bits, _counting_lists,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_COMBOS = [
    (p, g, m, c)
    for p, g, m, c in itertools.product(FLOATS, FLOATS, [torch.float32, torch.bfloat16], [None] + FLOATS[1:])
    if c is None or p == torch.float32
]
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, bias_correction=True)
# 70 one-chunk tensors overflow the 32-tensor table; 200_003 elements span 4 chunks; empties around
NUMELS = [0, 1, 65535, 65536, 65537, 200_003] + [17] * 70 + [0]


@pytest.fixture(scope="module")
def cuda_kernel():
    if not _ext.kernels_available("cuda"):
        pytest.skip(f"CUDA kernel not built ({_ext.kernel_detail('cuda')})")


@contextlib.contextmanager
def no_host_sync():
    """Any host synchronisation with the device inside the block raises."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _lists(numels, combo, device="cpu"):
    param, grad, moment, copy = combo
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=gen).to(param) for n in numels]
    grads = [(torch.randn(n, generator=gen) * 64).to(grad) for n in numels]
    exp_avgs = [(torch.randn(n, generator=gen) * 0.1).to(moment) for n in numels]
    exp_avg_sqs = [torch.rand(n, generator=gen).to(moment) for n in numels]
    steps = [torch.full((), 3.0) for _ in numels]
    copies = [p.to(copy) for p in params] if copy else []
    return [[t.to(device) for t in lst] for lst in (params, grads, exp_avgs, exp_avg_sqs, steps, copies)]


def _coarsest(combo):
    return next((d for d in (torch.bfloat16, torch.float16) if d in combo), torch.float32)


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "grad-scale"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_cuda_kernel_matches_cpu_kernel_bit_for_bit(cuda_kernel, combo, adam_w_mode, scaled):
    cpu, gpu = _lists(NUMELS, combo), _lists(NUMELS, combo, "cuda")
    kw = dict(HYPER, adam_w_mode=adam_w_mode, unscale_grads=True)
    torch.ops.apexlite.fused_adam_(*cpu, **kw, grad_scale=torch.tensor([64.0]) if scaled else None)
    torch.ops.apexlite.fused_adam_(*gpu, **kw, grad_scale=torch.tensor([64.0], device="cuda") if scaled else None)
    for name, cpu_list, gpu_list in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "steps", "copies"), cpu, gpu):
        for i, (want, got) in enumerate(zip(cpu_list, gpu_list)):
            differ = (_bits(got.cpu()) != _bits(want)).sum().item()
            assert differ == 0, f"{name}[{i}]: {differ} of {want.numel()} elements differ from the CPU kernel"


@pytest.mark.parametrize("combo", DTYPE_COMBOS[::3], ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_cuda_kernel_matches_reference(cuda_kernel, combo):
    ours, ref = _lists(NUMELS, combo, "cuda"), _lists(NUMELS, combo, "cuda")
    torch.ops.apexlite.fused_adam_(*ours, **HYPER, adam_w_mode=True)
    reference_adam_step(*ref, **HYPER, adam_w_mode=True)
    for got_list, want_list in zip(ours, ref):
        for got, want in zip(got_list, want_list):
            torch.testing.assert_close(got.float(), want.float(), **dtype_tols(_coarsest(combo)))


@pytest.mark.parametrize("name", list(PACKING_CASES))
def test_cuda_kernel_packing_updates_every_element_once(cuda_kernel, name):
    lists = [[t.cuda() for t in lst] for lst in _counting_lists(PACKING_CASES[name].numels)]
    torch.ops.apexlite.fused_adam_(*lists, **COUNTING, adam_w_mode=True)
    for i, (param, step) in enumerate(zip(lists[0], lists[4])):
        wrong = int((param != -1).sum())
        assert wrong == 0, f"tensor {i} ({param.numel()} elements): {wrong} elements not updated exactly once"
        assert float(step) == i + 1


@pytest.mark.parametrize("found_inf", [1.0, 2.0])
def test_cuda_kernel_skips_on_device_flag_without_sync(cuda_kernel, found_inf):
    combo = (torch.float32, torch.float16, torch.float32, torch.float16)
    lists = _lists([3, 70_000], combo, "cuda")
    before = [[t.clone() for t in lst] for lst in lists]
    flag, scale = torch.full((1,), found_inf, device="cuda"), torch.full((1,), 8.0, device="cuda")
    with no_host_sync():
        torch.ops.apexlite.fused_adam_(*lists, **HYPER, adam_w_mode=True, grad_scale=scale, found_inf=flag,
                                       unscale_grads=True)
    for got_list, want_list in zip(lists, before):
        assert all(torch.equal(a, b) for a, b in zip(got_list, want_list))


@pytest.mark.parametrize("combo", DTYPE_COMBOS[::3], ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_torch_fused_path_on_cuda_matches_reference(combo):
    ours, ref = _lists(NUMELS, combo, "cuda"), _lists(NUMELS, combo, "cuda")
    kw = dict(HYPER, adam_w_mode=True, grad_scale=torch.full((1,), 64.0, device="cuda"), unscale_grads=True)
    _torch_fused.torch_fused_adam_step(*ours, **kw)
    reference_adam_step(*ref, **kw)
    for got_list, want_list in zip(ours, ref):
        for got, want in zip(got_list, want_list):
            torch.testing.assert_close(got.float(), want.float(), **dtype_tols(_coarsest(combo)))


@pytest.mark.parametrize("implementation", ["kernel", "torch"])
@pytest.mark.parametrize("master_weights", [False, True])
def test_fused_adam_step_never_syncs(implementation, master_weights):
    if implementation == "kernel" and not _ext.kernels_available("cuda"):
        pytest.skip("CUDA kernel not built")
    dtype = torch.bfloat16 if master_weights else torch.float32
    params = [torch.nn.Parameter(torch.randn(n, device="cuda").to(dtype)) for n in (1000, 70_000, 3)]
    opt = FusedAdam(params, lr=1e-3, master_weights=master_weights, implementation=implementation)
    for step in range(3):
        for p in params:
            p.grad = torch.randn_like(p) * 1024
        opt.grad_scale = torch.full((1,), 1024.0, device="cuda")
        opt.found_inf = torch.full((1,), float(step == 1), device="cuda")  # the middle step is skipped
        with no_host_sync():
            opt.step()
    assert all(float(opt.state[p]["step"]) == 2.0 for p in params)
