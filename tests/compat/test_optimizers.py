"""apex.optimizers' FusedSGD/LAMB/NovoGrad/Adagrad against torch.optim and small independent references."""
import pytest
import torch

from apexlite.compat.apex import optimizers
from tests._helpers.tolerances import dtype_tols


def _params(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=gen, dtype=torch.float32).to(dtype).requires_grad_(),
            torch.randn(4, generator=gen, dtype=torch.float32).to(dtype).requires_grad_()]


def _grads(step, params):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]


def _run(make_opt, params, steps=5):
    opt = make_opt(params)
    for step in range(steps):
        for p, g in zip(params, _grads(step, params)):
            p.grad = g.clone()
        opt.step()
    return params


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


@pytest.mark.parametrize("kwargs", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
])
def test_fused_sgd_matches_torch_sgd(kwargs):
    ours = _run(lambda p: optimizers.FusedSGD(p, **kwargs), _params())
    ref = _run(lambda p: torch.optim.SGD(p, **kwargs), _params())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))


def test_fused_sgd_weight_decay_after_momentum():
    lr, momentum, wd = 0.1, 0.9, 0.05
    params = _run(lambda p: optimizers.FusedSGD(p, lr=lr, momentum=momentum, weight_decay=wd,
                                                wd_after_momentum=True), _params(), steps=3)
    expected = [p.detach().clone() for p in _params()]
    bufs = [None, None]
    for step in range(3):
        for i, g in enumerate(_grads(step, expected)):
            bufs[i] = g.clone() if bufs[i] is None else momentum * bufs[i] + g
            expected[i] = expected[i] - lr * (bufs[i] + wd * expected[i])
    for a, b in zip(params, expected):
        torch.testing.assert_close(a.detach(), b, **dtype_tols(torch.float32))


def test_fused_sgd_validation_messages():
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optimizers.FusedSGD(_params(), lr=-1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        optimizers.FusedSGD(_params(), lr=0.1, nesterov=True)


def test_fused_sgd_fp16_params_keep_dtype_and_follow_fp32_math():
    half = _run(lambda p: optimizers.FusedSGD(p, lr=0.1, momentum=0.9), _params(torch.float16))
    full = _run(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                [p.detach().float().requires_grad_() for p in _params(torch.float16)])
    for a, b in zip(half, full):
        assert a.dtype is torch.float16
        torch.testing.assert_close(a.float(), b, **dtype_tols(torch.float16))


def test_set_grad_none_defaults():
    params = _params()
    for p in params:
        p.grad = torch.ones_like(p)
    optimizers.FusedSGD(params, lr=0.1).zero_grad()  # apex default set_grad_none=False: zeroed, kept
    assert all(p.grad is not None and not p.grad.any() for p in params)
    optimizers.FusedLAMB(params).zero_grad()  # default set_grad_none=True
    assert all(p.grad is None for p in params)


def test_fused_adagrad_matches_torch_adagrad():
    ours = _run(lambda p: optimizers.FusedAdagrad(p, lr=0.1, weight_decay=0.01), _params())
    ref = _run(lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.01, eps=1e-10), _params())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))


def test_fused_adagrad_decoupled_weight_decay():
    lr, wd, eps = 0.1, 0.1, 1e-10
    params = _run(lambda p: optimizers.FusedAdagrad(p, lr=lr, weight_decay=wd, adagrad_w_mode=True), _params(), 3)
    expected = [p.detach().clone() for p in _params()]
    sums = [torch.zeros_like(p) for p in expected]
    for step in range(3):
        for i, g in enumerate(_grads(step, expected)):
            sums[i] = sums[i] + g * g
            expected[i] = expected[i] - lr * (g / (sums[i].sqrt() + eps) + wd * expected[i])
    for a, b in zip(params, expected):
        torch.testing.assert_close(a.detach(), b, **dtype_tols(torch.float32))


def test_fused_lamb_without_decay_is_adam():
    # weight_decay=0 and use_nvlamb=False: trust ratio 1, so LAMB's update is exactly Adam's.
    ours = _run(lambda p: optimizers.FusedLAMB(p, lr=0.01, weight_decay=0.0, eps=1e-8, max_grad_norm=0.0),
                _params())
    ref = _run(lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-8), _params())
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))


def test_fused_lamb_global_clipping_matches_clip_then_adam():
    params, ref_params = _params(), _params()
    lamb = optimizers.FusedLAMB(params, lr=0.01, weight_decay=0.0, eps=1e-8, max_grad_norm=0.5)
    adam = torch.optim.Adam(ref_params, lr=0.01, eps=1e-8)
    for step in range(4):
        for p, q, g in zip(params, ref_params, _grads(step, params)):
            p.grad, q.grad = g.clone(), g.clone()
        total = torch.stack([g.norm() for g in _grads(step, params)]).norm()
        assert total > 0.5  # the clip is active in this test
        for q in ref_params:
            q.grad /= total / 0.5
        lamb.step()
        adam.step()
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))


def test_fused_lamb_trust_ratio_reference():
    lr, wd, b1, b2, eps = 0.02, 0.1, 0.9, 0.999, 1e-6
    params = _run(lambda p: optimizers.FusedLAMB(p, lr=lr, weight_decay=wd, max_grad_norm=0.0), _params(), 2)
    expected = [p.detach().clone() for p in _params()]
    m = [torch.zeros_like(p) for p in expected]
    v = [torch.zeros_like(p) for p in expected]
    for step in range(1, 3):
        for i, g in enumerate(_grads(step - 1, expected)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1 ** step)) / ((v[i] / (1 - b2 ** step)).sqrt() + eps) + wd * expected[i]
            expected[i] = expected[i] - lr * expected[i].norm() / u.norm() * u
    for a, b in zip(params, expected):
        torch.testing.assert_close(a.detach(), b, **dtype_tols(torch.float32))


def test_fused_lamb_rejects_amsgrad():
    with pytest.raises(RuntimeError, match="AMSGrad"):
        optimizers.FusedLAMB(_params(), amsgrad=True)


def test_fused_novograd_matches_reference_novograd():
    # apex's own check: betas=(0.95, 0), no bias correction, decay inside the moment, no averaging.
    lr, b1, wd, eps = 0.01, 0.95, 0.01, 1e-8
    params = _run(lambda p: optimizers.FusedNovoGrad(p, lr=lr, betas=(b1, 0), weight_decay=wd, eps=eps,
                                                     bias_correction=False, reg_inside_moment=True,
                                                     grad_averaging=False), _params(), 4)
    expected = [p.detach().clone() for p in _params()]
    m = [torch.zeros_like(p) for p in expected]
    for step in range(4):
        for i, g in enumerate(_grads(step, expected)):
            m[i] = b1 * m[i] + (g / (g.norm() + eps) + wd * expected[i])
            expected[i] = expected[i] - lr * m[i]
    for a, b in zip(params, expected):
        torch.testing.assert_close(a.detach(), b, **dtype_tols(torch.float32))


def test_fused_novograd_second_moment_blends_squared_norms():
    b1, b2, lr = 0.9, 0.5, 0.1
    params = _run(lambda p: optimizers.FusedNovoGrad(p, lr=lr, betas=(b1, b2), bias_correction=False,
                                                     grad_averaging=False), _params(), 2)
    expected = [p.detach().clone() for p in _params()]
    for i in range(2):
        g0, g1 = _grads(0, expected)[i], _grads(1, expected)[i]
        v0 = g0.norm()  # first step: v starts at the first norm, so the blend leaves it unchanged
        v1 = (b2 * v0 ** 2 + (1 - b2) * g1.norm() ** 2).sqrt()
        m0 = g0
        p1 = expected[i] - lr * m0 / (v0 + 1e-8)
        m1 = b1 * m0 + g1
        expected[i] = p1 - lr * m1 / (v1 + 1e-8)
    for a, b in zip(params, expected):
        torch.testing.assert_close(a.detach(), b, **dtype_tols(torch.float32))


def test_fused_adam_is_apexlite_fused_adam():
    from apexlite.optimizers import FusedAdam

    assert issubclass(optimizers.FusedAdam, FusedAdam)
    assert type(optimizers.FusedAdam(_params())).__mro__[1] is FusedAdam


@pytest.mark.parametrize("name", ["FusedLAMB", "FusedMixedPrecisionLamb"])
def test_fused_lamb_clips_every_group_at_the_constructors_max_grad_norm(name, caplog):
    """apex read max_grad_norm from the defaults for all groups (one global norm): a group's own value is not
    used, and is warned about."""
    cls = getattr(optimizers, name)
    params, ref_params = _params(), _params()
    given = cls([{"params": params[:1]}, {"params": params[1:], "max_grad_norm": 1000.0}], lr=0.01,
                weight_decay=0.5, adam_w_mode=False, max_grad_norm=0.5)
    assert "param group 1 sets max_grad_norm=1000.0, which is not used" in caplog.text
    plain = cls([{"params": ref_params[:1]}, {"params": ref_params[1:]}], lr=0.01, weight_decay=0.5,
                adam_w_mode=False, max_grad_norm=0.5)
    for step in range(3):
        for p, q, g in zip(params, ref_params, _grads(step, params)):
            p.grad, q.grad = g.clone(), g.clone()
        given.step()
        plain.step()
    for a, b in zip(params, ref_params):
        assert torch.equal(a, b)
