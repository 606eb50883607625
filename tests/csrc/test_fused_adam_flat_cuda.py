"""The flat-buffer FusedAdam on a real GPU (marker ``cuda``; skipped without one; run by scripts/gpu_check.sh).

The CUDA flat kernel against the CPU flat kernel bit for bit (both keep every float operation as
written), on buffers that take the vector loads and on buffers that do not, with tails and several
grid-stride turns; FusedAdam on CUDA with flat buffers against ``flat_buffers=False`` (the list
kernel) bit for bit over steps with fresh grads, kept grads and grads that are views of one bucket (read
where they are by the table kernel), masters included; grads moved into the
buffer on the device keep their identity; and no step waits for the device.
"""
from __future__ import annotations

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam
from tests.csrc.test_fused_adam_cuda import no_host_sync
from tests.csrc.test_fused_adam_flat_op import DTYPE_COMBOS, HYPER, _bits, flat_of, tensor_lists

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# 3 x 2^20 + 5 elements: several grid-stride turns on any GPU (a grid of one wave of 256-thread blocks), a tail
NUMELS = [1, 3 << 20, 4] + [1] * 300


@pytest.fixture(scope="module")
def cuda_kernel():
    if not _ext.kernels_available("cuda"):
        pytest.skip(f"CUDA kernel not built ({_ext.kernel_detail('cuda')})")


def _on_cuda(flat, shift):
    """The buffers on the GPU, ``shift`` elements into a larger allocation (1: unfit for vector loads)."""
    moved = []
    for index, buffer in enumerate(flat):
        if buffer is None or index == 4:
            moved.append(None if buffer is None else buffer.cuda())
            continue
        whole = torch.empty(buffer.numel() + shift, dtype=buffer.dtype, device="cuda")
        moved.append(whole[shift:].copy_(buffer))
    return moved


@pytest.mark.parametrize("shift", [0, 1], ids=["vector-loads", "unaligned"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "grad-scale"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_cuda_flat_kernel_matches_cpu_flat_kernel_bit_for_bit(cuda_kernel, combo, adam_w_mode, scaled, shift):
    cpu = flat_of(tensor_lists(NUMELS, combo))
    gpu = _on_cuda(cpu, shift)
    kwargs = dict(HYPER, bias_correction=True, adam_w_mode=adam_w_mode, unscale_grads=True)
    torch.ops.apexlite.fused_adam_flat_(*cpu, **kwargs, grad_scale=torch.tensor([64.0]) if scaled else None)
    torch.ops.apexlite.fused_adam_flat_(*gpu, **kwargs,
                                        grad_scale=torch.tensor([64.0], device="cuda") if scaled else None)
    for index, (want, got) in enumerate(zip(cpu, gpu)):
        if want is not None:
            differ = int((_bits(got.cpu()) != _bits(want)).sum())
            assert differ == 0, f"buffer {index}: {differ} of {want.numel()} elements differ from the CPU kernel"


@pytest.mark.parametrize("shift", [0, 1], ids=["vector-loads", "unaligned"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "grad-scale"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_cuda_grad_list_op_matches_cpu_flat_kernel_bit_for_bit(cuda_kernel, combo, scaled, shift):
    """fused_adam_flat_grad_list_ (each grad read where it is) against the CPU flat op over the same values."""
    lists = tensor_lists(NUMELS, combo)
    cpu = flat_of(lists)
    gpu = _on_cuda(cpu, shift)
    grads = [g.cuda() for g in lists[1]]
    starts, at = [], 0
    for g in grads:
        starts.append(at)
        at += g.numel()
    kwargs = dict(HYPER, bias_correction=True, adam_w_mode=True, unscale_grads=True)
    torch.ops.apexlite.fused_adam_flat_(*cpu, **kwargs, grad_scale=torch.tensor([64.0]) if scaled else None)
    with no_host_sync():
        torch.ops.apexlite.fused_adam_flat_grad_list_(
            gpu[0], grads, torch.tensor(starts), gpu[2], gpu[3], gpu[4], gpu[5], **kwargs,
            grad_scale=torch.tensor([64.0], device="cuda") if scaled else None)
    gpu[1] = torch.cat(grads)
    for index, (want, got) in enumerate(zip(cpu, gpu)):
        if want is not None:
            differ = int((_bits(got.cpu()) != _bits(want)).sum())
            assert differ == 0, f"buffer {index}: {differ} of {want.numel()} elements differ from the CPU kernel"


@pytest.mark.parametrize("found_inf", [1.0, float("nan")])
def test_cuda_flat_kernel_skips_on_device_flag_without_sync(cuda_kernel, found_inf):
    gpu = _on_cuda(flat_of(tensor_lists(NUMELS, (torch.float32, torch.float16, torch.float32, torch.float16))), 0)
    before = [None if t is None else t.clone() for t in gpu]
    with no_host_sync():
        torch.ops.apexlite.fused_adam_flat_(*gpu, **HYPER, bias_correction=True, adam_w_mode=True,
                                            grad_scale=torch.full((1,), 8.0, device="cuda"),
                                            found_inf=torch.full((1,), found_inf, device="cuda"), unscale_grads=True)
    assert all(a is None or torch.equal(a, b) for a, b in zip(gpu, before))


@pytest.mark.parametrize("regime", ["fresh-grads", "kept-grads", "views-of-one-bucket"])
@pytest.mark.parametrize("dtype, master_weights", [(torch.float32, False), (torch.bfloat16, True),
                                                   (torch.float16, True)], ids=["fp32", "bf16-masters", "fp16-masters"])
def test_fused_adam_flat_matches_list_kernel_on_cuda(cuda_kernel, dtype, master_weights, regime):
    shapes = [(300, 7), (5,), (64, 3, 3, 3), (1,)] + [(17,)] * 40
    gen = torch.Generator(device="cuda").manual_seed(0)
    init = [torch.randn(s, device="cuda", generator=gen).to(dtype) for s in shapes]
    runs = []
    for flat in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in init]
        runs.append((params, FusedAdam(params, lr=1e-2, weight_decay=0.02, master_weights=master_weights,
                                       flat_buffers=flat, implementation="kernel")))
    for step in range(4):
        grads = [torch.randn(s, device="cuda", generator=gen).to(dtype) for s in shapes]
        for params, opt in runs:
            if regime == "views-of-one-bucket":  # read where they are: one table launch (DDP's bucket views)
                bucket = torch.cat([g.flatten() for g in grads])
                for p, piece in zip(params, bucket.split([g.numel() for g in grads])):
                    p.grad = piece.view(p.shape)
            elif regime == "fresh-grads" or step == 0:
                for p, g in zip(params, grads):
                    p.grad = g.clone()
            else:
                for p, g in zip(params, grads):
                    p.grad.add_(g)
            assigned = [p.grad for p in params]
            with no_host_sync():
                opt.step()
            assert all(p.grad is a for p, a in zip(params, assigned))
    (flat_params, flat_opt), (list_params, list_opt) = runs
    assert len({p.untyped_storage().data_ptr() for p in flat_params}) == 1
    for p, q in zip(flat_params, list_params):
        assert torch.equal(_bits(p.detach()), _bits(q.detach()))
        for key in flat_opt.state[p]:
            assert torch.equal(_bits(flat_opt.state[p][key]), _bits(list_opt.state[q][key])), key
