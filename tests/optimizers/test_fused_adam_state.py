"""Checkpoints, master-weight hand-over for amp O2, and version counters."""
from __future__ import annotations

import io

import pytest
import torch

from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import (
    IMPLEMENTATIONS, STEPS, assert_close, assert_state_matches, fp32_leaves, leaves, run_side_by_side,
    set_grads, torch_adam,
)

# (param dtype, master_weights) combinations whose checkpoints must round-trip.
CHECKPOINT_CASES = [(torch.float32, False), (torch.bfloat16, True), (torch.float16, True)]


def _round_trip(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype, master_weights", CHECKPOINT_CASES)
def test_state_dict_round_trip_mid_run(implementation, dtype, master_weights):
    init = [t.to(dtype) for t in (torch.randn(40), torch.randn(3, 5))]
    ours_params, ref_params = leaves(init, dtype), fp32_leaves(init)
    kw = dict(lr=1e-2, weight_decay=0.02, master_weights=master_weights, implementation=implementation)
    ours = FusedAdam(ours_params, **kw)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2, weight_decay=0.02)
    run_side_by_side(ours, ours_params, ref, ref_params, dtype, steps=4)
    saved = _round_trip(ours.state_dict())
    assert ("master_param" in saved["state"][0]) == master_weights
    resumed = FusedAdam(ours_params, **kw)
    resumed.load_state_dict(saved)
    run_side_by_side(resumed, ours_params, ref, ref_params, dtype, steps=4)
    assert_state_matches(resumed, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_loads_torch_adam_checkpoint(implementation):
    init = [torch.randn(30), torch.randn(2, 2)]
    ours_params, ref_params = fp32_leaves(init), fp32_leaves(init)
    ref = torch_adam(ref_params, adam_w_mode=False, lr=1e-2)
    run_side_by_side(ref, ref_params, ref, ref_params, torch.float32, steps=3)
    with torch.no_grad():
        for p, r in zip(ours_params, ref_params):
            p.copy_(r)
    ours = FusedAdam(ours_params, lr=1e-2, adam_w_mode=False, implementation=implementation)
    ours.load_state_dict(_round_trip(ref.state_dict()))
    run_side_by_side(ours, ours_params, ref, ref_params, torch.float32, steps=4)
    assert_state_matches(ours, ours_params, ref, ref_params)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_apex_group_step_becomes_per_param_step(implementation):
    params = fp32_leaves([torch.randn(6)])
    ours = FusedAdam(params, implementation=implementation)
    apex_style = {
        "state": {0: {"exp_avg": torch.full((6,), 0.1), "exp_avg_sq": torch.full((6,), 0.01)}},
        "param_groups": [dict(ours.param_groups[0], params=[0], step=5)],
    }
    ours.load_state_dict(apex_style)
    assert float(ours.state[params[0]]["step"]) == 5.0
    assert "step" not in ours.param_groups[0]
    set_grads(params, [torch.randn(6)])
    ours.step()
    assert float(ours.state[params[0]]["step"]) == 6.0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_enable_master_weights_seeds_from_pre_cast_weights(implementation, dtype):
    fp32_init = [torch.randn(64), torch.randn(8, 8)]
    model = fp32_leaves(fp32_init)
    ref_params = fp32_leaves(fp32_init)
    ours = FusedAdam(model, lr=1e-3, implementation=implementation)
    saved = {p: p.detach().clone() for p in model}
    with torch.no_grad():  # what model.to(dtype) does to each parameter
        for p in model:
            p.data = p.data.to(dtype)
    ours.enable_master_weights(saved)
    for p in model:
        assert torch.equal(ours.state[p]["master_param"], saved[p])  # not the rounded half value
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-3)
    run_side_by_side(ours, model, ref, ref_params, dtype)
    assert_state_matches(ours, model, ref, ref_params)
    assert all(torch.equal(p.detach(), ours.state[p]["master_param"].to(dtype)) for p in model)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_enable_master_weights_without_seeds_starts_from_half_values(implementation):
    model = leaves([torch.randn(10)], torch.bfloat16)
    ours = FusedAdam(model, implementation=implementation)
    ours.enable_master_weights()
    master = ours.state[model[0]]["master_param"]
    assert master.dtype == torch.float32 and torch.equal(master, model[0].detach().float())


def test_enable_master_weights_rejects_foreign_tensors():
    ours = FusedAdam(leaves([torch.randn(10)], torch.bfloat16))
    with pytest.raises(ValueError, match="not params of this optimizer"):
        ours.enable_master_weights({torch.nn.Parameter(torch.randn(10)): torch.randn(10)})


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype, master_weights", CHECKPOINT_CASES)
def test_step_bumps_param_version(implementation, dtype, master_weights):
    params = leaves([torch.randn(20)], dtype)
    opt = FusedAdam(params, master_weights=master_weights, implementation=implementation)
    set_grads(params, [torch.randn(20).to(dtype)])
    before = params[0]._version
    opt.step()
    assert params[0]._version > before


@pytest.mark.parametrize("set_grad_none, expected", [(True, None), (False, 0.0)])
def test_zero_grad_default_follows_set_grad_none(set_grad_none, expected):
    param = torch.nn.Parameter(torch.randn(3))
    param.grad = torch.ones(3)
    FusedAdam([param], set_grad_none=set_grad_none).zero_grad()
    assert (param.grad is None) if expected is None else torch.equal(param.grad, torch.zeros(3))

