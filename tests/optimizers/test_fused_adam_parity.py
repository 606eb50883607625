"""FusedAdam agrees with torch.optim.Adam / AdamW on params and state, on every backend."""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam
from tests._helpers.layouts import CONTIGUOUS, PARAM_LAYOUTS, SHAPES
from tests.optimizers.adam_helpers import (
    IMPLEMENTATIONS, assert_close, assert_state_matches, fp32_leaves, run_side_by_side, torch_adam,
)

# (adam_w_mode, weight_decay): both decay modes, with and without decay.
DECAY_MODES = [(True, 0.0), (True, 0.05), (False, 0.0), (False, 0.05)]

# Sizes around the CPU kernel's tile (1024) and task (32768) boundaries, plus empty and large.
EDGE_SIZES = [0, 1, 1023, 1024, 1025, 32767, 32768, 32769, 200_003]

# Memory layouts a parameter can have (the shared table, plus a 0-d param); each must give torch's numbers.
PARAM_CASES = [pytest.param(layout, shape, id=f"{layout.name}{list(shape)}") for layout in PARAM_LAYOUTS
               for shape in SHAPES] + [pytest.param(CONTIGUOUS, (), id="scalar")]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("adam_w_mode, weight_decay", DECAY_MODES)
def test_matches_torch_over_steps(implementation, adam_w_mode, weight_decay):
    init = [torch.randn(37, 11), torch.randn(5), torch.randn(3, 2, 7)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    hyper = dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    ours = FusedAdam(ours_params, adam_w_mode=adam_w_mode, implementation=implementation, **hyper)
    ref = torch_adam(ref_params, adam_w_mode, **hyper)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_param_groups_keep_their_own_hyper_parameters(implementation):
    init = [torch.randn(20), torch.randn(30)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    groups = lambda ps: [{"params": [ps[0]], "lr": 1e-2}, {"params": [ps[1]], "lr": 5e-2, "weight_decay": 0.1}]
    ours = FusedAdam(groups(ours_params), implementation=implementation)
    ref = torch_adam(groups(ref_params), adam_w_mode=True, lr=1e-3)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("size", EDGE_SIZES)
def test_edge_sizes_match_torch(implementation, size):
    init = [torch.randn(size), torch.randn(3)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_empty_param_at_end_of_group_does_not_drop_updates(implementation):
    init = [torch.randn(70_000), torch.randn(9), torch.randn(0)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_many_tensors_in_one_group_match_torch(implementation):
    init = [torch.randn(1 + i % 17) for i in range(300)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("layout, shape", PARAM_CASES)
def test_param_layouts_match_torch(implementation, layout, shape):
    values = torch.randn(shape)
    ours_params = [torch.nn.Parameter(layout(values))]  # (a clone of a strided tensor would be contiguous)
    assert ours_params[0].stride() == layout(values).stride()
    ref_params = fp32_leaves([values])
    ours = FusedAdam(ours_params, lr=1e-2, weight_decay=0.01, implementation=implementation)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2, weight_decay=0.01)
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bias_correction_off_matches_reference(implementation):
    init = [torch.randn(50)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ours = FusedAdam(ours_params, lr=1e-2, bias_correction=False, implementation=implementation)
    oracle = FusedAdam(ref_params, lr=1e-2, bias_correction=False, implementation="reference")
    run_side_by_side(ours, ours_params, oracle, ref_params, torch.float32)
    assert_state_matches(ours, ours_params, oracle, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_first_step_without_bias_correction_follows_formula(implementation):
    start, grad = torch.randn(50), torch.randn(50)
    param = torch.nn.Parameter(start.clone())
    param.grad = grad.clone()
    FusedAdam([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, bias_correction=False,
              implementation=implementation).step()
    m, v = 0.1 * grad, 0.01 * grad * grad
    assert_close(param, start - 1e-2 * m / (v.sqrt() + 1e-8))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_closure_loss_is_returned(implementation):
    param = torch.nn.Parameter(torch.randn(4))
    opt = FusedAdam([param], implementation=implementation)

    def closure():
        opt.zero_grad()
        loss = (param * param).sum()
        loss.backward()
        return loss

    expected = (param.detach() ** 2).sum()
    assert_close(opt.step(closure), expected)
