"""A FusedAdam checkpoint with fp32 masters (amp O2, master_weights=True) loaded where params are fp32 (O0/O1).

Written as the probe that found it (issue 14): the O2 checkpoint loaded into an O1 run used to fail at
``step()`` with the kernel's internal "model_copies must be float16 or bfloat16" message. Now each
float32 param takes its master's values and training continues from the full-precision weights,
as a torch AdamW run started from those masters and moments does.
"""
from __future__ import annotations

import io

import pytest
import torch

from apexlite import amp
from apexlite.optimizers import FusedAdam
from tests.optimizers.adam_helpers import (
    HALF_DTYPES, IMPLEMENTATIONS, assert_state_matches, fp32_leaves, leaves, run_side_by_side, torch_adam,
)


def _round_trip(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_master_checkpoint_continues_on_fp32_params(implementation, dtype):
    init = [torch.randn(40).to(dtype), torch.randn(3, 5).to(dtype)]
    half_params, ref_params = leaves(init, dtype), fp32_leaves(init)
    kw = dict(lr=1e-2, weight_decay=0.02, implementation=implementation)
    o2 = FusedAdam(half_params, master_weights=True, **kw)
    ref = torch_adam(ref_params, adam_w_mode=True, lr=1e-2, weight_decay=0.02)
    run_side_by_side(o2, half_params, ref, ref_params, dtype, steps=4)
    saved = _round_trip(o2.state_dict())

    fp32_params = fp32_leaves(half_params)  # an O1 model loaded from the O2 model's (half) weights
    o1 = FusedAdam(fp32_params, **kw)
    o1.load_state_dict(saved)
    for index, param in enumerate(fp32_params):
        assert torch.equal(param.detach(), saved["state"][index]["master_param"])
        assert "master_param" not in o1.state[param]
        assert torch.equal(o1.state[param]["exp_avg"], saved["state"][index]["exp_avg"])
    run_side_by_side(o1, fp32_params, ref, ref_params, torch.float32, steps=4)
    assert_state_matches(o1, fp32_params, ref, ref_params)


def test_master_of_another_shape_is_rejected_before_anything_loads():
    params = fp32_leaves([torch.randn(6)])
    opt = FusedAdam(params)
    before = params[0].detach().clone()
    bad = {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.zeros(6), "exp_avg_sq": torch.zeros(6),
                         "master_param": torch.zeros(7)}},
           "param_groups": [dict(opt.param_groups[0], params=[0])]}
    with pytest.raises(ValueError, match=r"master weight of shape \(7,\) for a param of shape \(6,\)"):
        opt.load_state_dict(bad)
    assert not opt.state and torch.equal(params[0].detach(), before)


def test_moment_of_another_shape_is_rejected_before_anything_loads():
    """A (1,)-shaped moment would otherwise broadcast into place without any error."""
    params = fp32_leaves([torch.randn(6)])
    opt = FusedAdam(params)
    bad = {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.ones(1), "exp_avg_sq": torch.zeros(6)}},
           "param_groups": [dict(opt.param_groups[0], params=[0])]}
    with pytest.raises(ValueError, match=r"exp_avg of shape \(1,\) for a param of shape \(6,\)"):
        opt.load_state_dict(bad)
    assert not opt.state


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train(model, opt, steps, low):
    for step in range(steps):
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(step))
        with amp.scale_loss(model(x.to(low) if low else x).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("low", HALF_DTYPES, ids=str)
def test_o2_checkpoint_resumes_in_an_o1_run(low):
    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O2", dtype=low, verbosity=0)
    _train(model, opt, 3, low)
    ckpt = _round_trip({"model": model.state_dict(), "opt": opt.state_dict()})
    masters = [opt.state[p]["master_param"].clone() for p in model.parameters()]
    amp.deinitialize()

    model = _model()
    opt = FusedAdam(model.parameters(), lr=1e-2)
    model, opt = amp.initialize(model, opt, opt_level="O1", dtype=low, verbosity=0)
    try:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        for param, master in zip(model.parameters(), masters):
            assert param.dtype is torch.float32 and torch.equal(param.detach(), master)
        before = [p.detach().clone() for p in model.parameters()]
        _train(model, opt, 2, None)
        assert all(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
        assert all(torch.isfinite(p).all() for p in model.parameters())
        assert all(float(opt.state[p]["step"]) == 5.0 for p in model.parameters())
    finally:
        amp.deinitialize()
