"""FusedSGD's momentum storage for fp16/bf16 params: the param's dtype, as apex's multi_tensor_sgd kept it.

apex's kernel (apex-reference §8.3; csrc/multi_tensor_sgd_kernel.cu) reads weight, grad and momentum
into fp32 registers, computes the new momentum and the step in fp32, uses the unrounded momentum for
the step, and stores the momentum back in the weight's dtype. The reference here is torch.optim.SGD
on fp32 copies whose params and momentum buffers are rounded to the half dtype after every step,
which is that rule built from torch's own optimizer.
"""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedSGD

OPTIONS = {
    "momentum": dict(lr=0.1, momentum=0.9),
    "dampening": dict(lr=0.1, momentum=0.9, dampening=0.3),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True),
    "weight-decay": dict(lr=0.1, momentum=0.9, weight_decay=0.05),
}


def _run_pair(dtype, options, steps=6):
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(33, 7, generator=gen).to(dtype), torch.randn(5, generator=gen).to(dtype)]
    ours_params = [torch.nn.Parameter(t.clone()) for t in init]
    ref_params = [torch.nn.Parameter(t.float()) for t in init]
    ours = FusedSGD(ours_params, **options)
    ref = torch.optim.SGD(ref_params, foreach=False, **options)
    for _ in range(steps):
        grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in ours_params]
        for p, r, g in zip(ours_params, ref_params, grads):
            p.grad, r.grad = g, g.float()
        ours.step()
        ref.step()
        with torch.no_grad():  # what a half param and a half momentum buffer can hold
            for r in ref_params:
                r.copy_(r.to(dtype))
                ref.state[r]["momentum_buffer"].copy_(ref.state[r]["momentum_buffer"].to(dtype))
    return ours, ours_params, ref, ref_params


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_params_keep_half_momentum_with_apex_rounding(dtype, name):
    ours, ours_params, ref, ref_params = _run_pair(dtype, OPTIONS[name])
    for p, r in zip(ours_params, ref_params):
        buf = ours.state[p]["momentum_buffer"]
        assert p.dtype is dtype and buf.dtype is dtype
        assert torch.equal(p.detach().float(), r.detach())
        assert torch.equal(buf.float(), ref.state[r]["momentum_buffer"])


def test_half_momentum_halves_optimizer_state_memory():
    ours, ours_params, _, _ = _run_pair(torch.float16, OPTIONS["momentum"], steps=1)
    state_bytes = sum(t.numel() * t.element_size() for s in ours.state.values() for t in s.values())
    assert state_bytes == 2 * sum(p.numel() for p in ours_params)


def test_fp32_params_match_torch_sgd_bit_for_bit():
    ours, ours_params, ref, ref_params = _run_pair(torch.float32, OPTIONS["nesterov"])
    for p, r in zip(ours_params, ref_params):
        assert torch.equal(p, r) and ours.state[p]["momentum_buffer"].dtype is torch.float32
        assert torch.equal(ours.state[p]["momentum_buffer"], ref.state[r]["momentum_buffer"])
