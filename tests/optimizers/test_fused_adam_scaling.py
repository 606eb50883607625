"""Loss-scale contract: grad_scale unscales in-register, found_inf skips the step bit-identically."""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import (
    IMPLEMENTATIONS, STEPS, assert_close, assert_state_matches, fp32_leaves, leaves, set_grads, torch_adam,
)

# Where a non-finite value lands: (tensor index, element index) in a [big, small] param list.
INJECTION_SITES = {"first_element_first_tensor": (0, 0), "middle_first_tensor": (0, 2000),
                   "last_element_last_tensor": (1, -1)}
BAD_VALUES = [float("inf"), float("-inf"), float("nan")]


def _snapshot(opt, params):
    return [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}) for p in params]


def _assert_bit_identical(before, opt, params):
    for (old_param, old_state), p in zip(before, params):
        assert torch.equal(old_param, p.detach())
        for key, old in old_state.items():
            assert torch.equal(old, opt.state[p][key]), key


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("leave_grads_scaled", [False, True], ids=["grads-unscaled", "grads-left-scaled"])
def test_grad_scale_attribute_unscales(implementation, leave_grads_scaled):
    init = [torch.randn(100), torch.randn(7, 3)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ours.leave_grads_scaled = leave_grads_scaled
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    ours.grad_scale = torch.tensor([1024.0])
    for _ in range(STEPS):
        grads = [torch.randn(p.shape) for p in ours_params]
        set_grads(ours_params, [g * 1024 for g in grads])
        set_grads(ref_params, grads)
        ours.step()
        ref.step()
    assert_state_matches(ours, ours_params, ref, ref_params)
    for p, r in zip(ours_params, ref_params):  # a power-of-two scale unscales exactly
        assert torch.equal(p.grad, r.grad * 1024 if leave_grads_scaled else r.grad)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_grads_of_master_weights_are_stored_unscaled(implementation, dtype):
    params = leaves([torch.randn(300), torch.randn(5)], dtype)
    opt = FusedAdam(params, lr=1e-2, master_weights=True, implementation=implementation)
    scaled = [(torch.randn(p.shape) * 3000).to(dtype) for p in params]
    set_grads(params, scaled)
    opt.grad_scale = torch.tensor([3.0])  # not a power of two: the stored value is rounded once
    opt.step()
    for p, g in zip(params, scaled):
        assert torch.equal(p.grad, (g.float() * (1 / 3.0)).to(dtype))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("master_weights", [False, True])
def test_found_inf_attribute_skips_whole_step(implementation, master_weights):
    dtype = torch.bfloat16 if master_weights else torch.float32
    params = leaves([torch.randn(50), torch.randn(4)], dtype)
    opt = FusedAdam(params, lr=1e-2, master_weights=master_weights, implementation=implementation)
    set_grads(params, [torch.randn(p.shape).to(dtype) for p in params])
    opt.step()
    before = _snapshot(opt, params)
    opt.found_inf = torch.tensor([1.0])
    opt.step()
    _assert_bit_identical(before, opt, params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("site", sorted(INJECTION_SITES))
@pytest.mark.parametrize("bad", BAD_VALUES, ids=["inf", "-inf", "nan"])
def test_grad_scaler_overflow_skips_bit_identically(implementation, site, bad):
    params = fp32_leaves([torch.randn(4096), torch.randn(9)])
    opt = FusedAdam(params, lr=1e-2, implementation=implementation)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale(torch.zeros(()))  # creates the scale, as the scaled backward of a real loop would
    set_grads(params, [torch.randn(p.shape) for p in params])
    scaler.step(opt)
    scaler.update()
    before = _snapshot(opt, params)
    grads = [torch.randn(p.shape) for p in params]
    tensor, element = INJECTION_SITES[site]
    grads[tensor].view(-1)[element] = bad
    set_grads(params, grads)
    scaler.step(opt)
    scaler.update()
    _assert_bit_identical(before, opt, params)
    assert scaler.get_scale() == 2.0**9


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_grad_scaler_training_matches_unscaled_torch(implementation):
    init = [torch.randn(16, 8), torch.randn(8)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    for _ in range(STEPS):
        x = torch.randn(4, 16)
        for params, opt in ((ours_params, ours), (ref_params, ref)):
            opt.zero_grad()
            loss = (x @ params[0] + params[1]).square().mean()
            (scaler.scale(loss) if opt is ours else loss).backward()
        scaler.step(ours)
        scaler.update()
        ref.step()
    assert_state_matches(ours, ours_params, ref, ref_params)
    assert not hasattr(ours, "grad_scale") and not hasattr(ours, "found_inf")
