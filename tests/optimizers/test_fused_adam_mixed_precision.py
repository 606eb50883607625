"""Mixed precision inside the step: master weights, half gradients, low-precision moments."""
from __future__ import annotations

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import (
    HALF_DTYPES, IMPLEMENTATIONS, STEPS, assert_close, assert_state_matches, fp32_leaves, leaves,
    run_side_by_side, set_grads, torch_adam,
)

GRAD_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _shapes():
    return [torch.randn(33, 7), torch.randn(1025), torch.randn(1)]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_master_weights_follow_fp32_reference(implementation, dtype):
    init = [t.to(dtype) for t in _shapes()]
    ours_params, ref_params = leaves(init, dtype), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, weight_decay=0.01, master_weights=True, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2, weight_decay=0.01)
    run_side_by_side(ours, ours_params, ref, ref_params, dtype)
    assert_state_matches(ours, ours_params, ref, ref_params)
    assert all(ours.state[p]["exp_avg"].dtype == torch.float32 for p in ours_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_model_param_is_rounded_master(implementation, dtype):
    ours_params = leaves(_shapes(), dtype)
    ours = FusedAdam(ours_params, lr=1e-2, master_weights=True, implementation=implementation)
    set_grads(ours_params, [torch.randn(p.shape).to(dtype) for p in ours_params])
    ours.step()
    for p in ours_params:
        assert p.dtype == dtype
        assert torch.equal(p.detach(), ours.state[p]["master_param"].to(dtype))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("grad_dtype", GRAD_DTYPES)
def test_half_grads_on_fp32_params_are_read_directly(implementation, grad_dtype):
    init = _shapes()
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    run_side_by_side(ours, ours_params, ref, ref_params, grad_dtype)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="this torch has no Tensor.grad_dtype")
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_fp32_param_with_bf16_grad_dtype(implementation):
    init = torch.randn(64)
    param, ref_param = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    param.grad_dtype = torch.bfloat16
    ours = FusedAdam([param], lr=1e-2, implementation=implementation)
    ref = torch_adam([ref_param], adam_w_mode=True, lr=1e-2)
    for _ in range(STEPS):
        target = torch.randn(64)
        ours.zero_grad()
        ((param - target) ** 2).sum().backward()
        assert param.grad.dtype == torch.bfloat16
        ref_param.grad = param.grad.float()
        ours.step()
        ref.step()
    assert_state_matches(ours, [param], ref, [ref_param])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_params_without_masters_round_each_step(implementation, dtype):
    init = [t.to(dtype) for t in _shapes()]
    ours_params, ref_params = leaves(init, dtype), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    for _ in range(STEPS):
        grads = [torch.randn(p.shape).to(dtype) for p in ours_params]
        set_grads(ours_params, grads)
        set_grads(ref_params, [g.float() for g in grads])
        ours.step()
        ref.step()
        with torch.no_grad():  # the reference keeps only what a half param can hold
            for p, r in zip(ours_params, ref_params):
                r.copy_(r.to(dtype))
    for p, r in zip(ours_params, ref_params):
        assert_close(p, r, dtype)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_master_weights_keep_moving_where_plain_bf16_stalls(implementation):
    plain = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
    mastered = torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16))
    ref_param = torch.nn.Parameter(torch.ones(256))
    opts = [FusedAdam([plain], lr=1e-4, implementation=implementation),
            FusedAdam([mastered], lr=1e-4, master_weights=True, implementation=implementation),
            torch_adam([ref_param], adam_w_mode=True, lr=1e-4)]
    for _ in range(40):
        grad = torch.rand(256).add_(0.5)
        for p, opt in zip((plain, mastered, ref_param), opts):
            p.grad = grad.to(p.dtype)
            opt.step()
    assert torch.equal(plain.detach(), torch.ones_like(plain))  # every 1e-4 update rounds away
    assert_close(opts[1].state[mastered]["master_param"], ref_param)  # ~40 * 1e-4 below 1.0
    assert torch.equal(mastered.detach(), ref_param.detach().to(torch.bfloat16))
    assert (mastered.detach() < 1).all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bf16_moments_track_fp32_moments(implementation):
    init = _shapes()
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, exp_avg_dtype=torch.bfloat16, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert all(ours.state[p]["exp_avg_sq"].dtype == torch.bfloat16 for p in ours_params)
    assert_state_matches(ours, ours_params, ref, ref_params, torch.bfloat16)


@pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_kernel_and_reference_agree_on_bf16_moments_with_masters(dtype):
    init = [t.to(dtype) for t in _shapes()]
    a_params, b_params = leaves(init, dtype), leaves(init, dtype)
    kw = dict(lr=1e-2, master_weights=True, exp_avg_dtype=torch.bfloat16)
    a = FusedAdam(a_params, implementation="kernel", **kw)
    b = FusedAdam(b_params, implementation="reference", **kw)
    run_side_by_side(a, a_params, b, b_params, dtype)
    assert_state_matches(a, a_params, b, b_params, torch.bfloat16)
