"""FusedNovoGrad: apex's rule (both norm types and moment modes), apex's group layout, checkpoints."""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedNovoGrad
from tests._helpers import optimizer_refs as ref
from tests._helpers.tolerances import dtype_tols

CASES = [
    dict(norm_type=2, reg_inside_moment=False, init_zero=False, weight_decay=0.0),
    dict(norm_type=0, reg_inside_moment=False, init_zero=False, weight_decay=0.01),
    dict(norm_type=0, reg_inside_moment=True, init_zero=True, weight_decay=0.01),
    dict(norm_type=2, reg_inside_moment=True, init_zero=True, weight_decay=0.1),
]


def _params(dtypes=(torch.float32, torch.float32)):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape, dtype in zip([(6, 3), (5,)], dtypes)]


def _grads(step, params):
    gen = torch.Generator().manual_seed(50 + step)
    return [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_steps_follow_apex_rule_and_keep_group_norms(case):
    params = _params()
    opt = FusedNovoGrad(params, lr=0.01, betas=(0.9, 0.6), **case)
    exp_p = [p.detach().clone() for p in params]
    exp_m = [torch.zeros_like(p) for p in exp_p]
    first = _grads(0, params)
    order = 2 if case["norm_type"] == 2 else float("inf")
    exp_n = torch.zeros(2) if case["init_zero"] else torch.stack([g.norm(order) for g in first])
    for step in range(1, 5):
        grads = _grads(step - 1, params)
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        exp_p, exp_m, exp_n = ref.novograd(
            exp_p, grads, exp_m, exp_n, lr=0.01, beta1=0.9, beta2=0.6, eps=1e-8, step=step, bias_correction=True,
            wd=case["weight_decay"], grad_averaging=True, mode=0 if case["reg_inside_moment"] else 1,
            norm_type=case["norm_type"])
    for p, e in zip(params, exp_p):
        torch.testing.assert_close(p.detach(), e, **dtype_tols(torch.float32))
    reduced, full = opt.param_groups[0]["exp_avg_sq"]  # apex's layout: [fp16 norms, fp32 norms]
    assert reduced.numel() == 0
    torch.testing.assert_close(full, exp_n, **dtype_tols(torch.float32))


def test_half_params_take_the_first_norm_slot():
    params = _params((torch.float16, torch.float32))
    opt = FusedNovoGrad(params, lr=0.01)
    for p, g in zip(params, _grads(0, params)):
        p.grad = g
    opt.step()
    reduced, full = opt.param_groups[0]["exp_avg_sq"]
    assert reduced.shape == (1,) and full.shape == (1,)
    assert params[0].dtype is torch.float16 and opt.state[params[0]]["exp_avg"].dtype is torch.float32


def test_checkpoint_round_trip_continues_exactly():
    straight, resumed = _params(), _params()
    opt, first = FusedNovoGrad(straight, lr=0.01), FusedNovoGrad(resumed, lr=0.01)
    for step in range(5):
        if step == 2:
            second = FusedNovoGrad(resumed, lr=0.01)
            second.load_state_dict(first.state_dict())
            first = second
        for params in (straight, resumed):
            for p, g in zip(params, _grads(step, params)):
                p.grad = g
        opt.step()
        first.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_a_param_that_stops_getting_grads_is_reported():
    params = _params()
    opt = FusedNovoGrad(params, lr=0.01)
    for p, g in zip(params, _grads(0, params)):
        p.grad = g
    opt.step()
    params[1].grad = None
    with pytest.raises(RuntimeError, match="same params to receive gradients"):
        opt.step()
