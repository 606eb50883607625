"""apex's 2019 optimizer API (apex.contrib.optimizers, and apex.optimizers.FP16_Optimizer / FusedAdam as 2019
scripts used them) against apex's 2019 kernel formula and fp32 torch.optim training."""
from __future__ import annotations

import importlib

import pytest
import torch

from apexlite.compat import apex_aliases
from tests._helpers import optimizer_refs as ref
from tests._helpers.tolerances import dtype_tols

with apex_aliases():
    from apex.contrib.optimizers import FP16_Optimizer, FusedAdam, FusedLAMB
    from apex.contrib.optimizers.fused_sgd import FusedSGD
    import apex.optimizers as apex_optimizers

FP32 = dtype_tols(torch.float32)
SHAPES = [(7, 3), (4,)]


def _tensors(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype) for shape in SHAPES]


def _params(dtype=torch.float32):
    return [torch.nn.Parameter(t) for t in _tensors(0, dtype)]


ADAM_2019_CASES = [
    dict(bias_correction=True, eps_inside_sqrt=False, weight_decay=0.0, scale=1.0),
    dict(bias_correction=True, eps_inside_sqrt=False, weight_decay=0.01, scale=128.0),
    dict(bias_correction=False, eps_inside_sqrt=False, weight_decay=0.01, scale=1.0),
    dict(bias_correction=True, eps_inside_sqrt=True, weight_decay=0.01, scale=4.0),
    dict(bias_correction=False, eps_inside_sqrt=True, weight_decay=0.0, scale=1.0),
]


@pytest.mark.parametrize("case", ADAM_2019_CASES, ids=str)
def test_fused_adam_2019_follows_apex_formula(case):
    case = dict(case)
    scale = case.pop("scale")
    params = _params()
    opt = FusedAdam(params, lr=1e-2, eps=1e-6, **case)
    expected = [(p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for step in range(1, 5):
        grads = [g * scale for g in _tensors(10 + step)]
        for p, g in zip(params, grads):
            p.grad = g
        opt.step(scale=scale)
        expected = [ref.adam_2019(p, g, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, step=step,
                                  bias_correction=case["bias_correction"], wd=case["weight_decay"], scale=scale,
                                  eps_inside_sqrt=case["eps_inside_sqrt"]) for (p, m, v), g in zip(expected, grads)]
    for p, (e, _, _) in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, **FP32)
    assert opt.state[params[0]]["step"] == 4  # apex's per-param int count


@pytest.mark.parametrize("nested", [False, True], ids=["flat-lists", "per-group-lists"])
def test_fused_adam_2019_takes_fp16_grads_and_writes_output_params(nested):
    masters = _params()
    model = [p.detach().half() for p in masters]
    opt = FusedAdam(masters, lr=1e-2, bias_correction=False, weight_decay=0.01)
    expected = [(p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p)) for p in masters]
    grads = [(g * 64).half() for g in _tensors(3)]
    opt.step(grads=[grads] if nested else grads, output_params=[model] if nested else model, scale=64.0)
    expected = [ref.adam_2019(p, g, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, step=1, bias_correction=False,
                              wd=0.01, scale=64.0) for (p, m, v), g in zip(expected, grads)]
    for master, half, (e, _, _) in zip(masters, model, expected):
        assert master.grad is None  # the grads were handed over, .grad stays untouched
        torch.testing.assert_close(master.detach(), e, **FP32)
        assert torch.equal(half, master.detach().half())


@pytest.mark.parametrize("given_norm", [True, False], ids=["grad_norms-given", "norm-computed"])
def test_fused_adam_2019_clips_by_the_unscaled_group_norm(given_norm):
    scale, max_norm = 8.0, 0.5
    params = _params()
    opt = FusedAdam(params, lr=1e-2, max_grad_norm=max_norm)
    grads = [g * scale for g in _tensors(4)]
    norm = torch.stack([g.norm() for g in grads]).norm()
    clip = (float(norm) / scale + 1e-6) / max_norm
    assert clip > 1  # the clip is active here
    expected = [ref.adam_2019(p.detach(), g, torch.zeros_like(p), torch.zeros_like(p), lr=1e-2, beta1=0.9,
                              beta2=0.999, eps=1e-8, step=1, bias_correction=True, wd=0.0, scale=scale * clip)[0]
                for p, g in zip(params, grads)]
    opt.step(grads=grads, scale=scale, grad_norms=[norm] if given_norm else None)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, **FP32)


def test_apex_optimizers_fused_adam_gives_the_2019_class_for_2019_keywords():
    legacy = apex_optimizers.FusedAdam(_params(), lr=1e-3, bias_correction=False, max_grad_norm=1.0)
    current = apex_optimizers.FusedAdam(_params(), lr=1e-3, bias_correction=False)
    assert type(legacy) is FusedAdam
    assert isinstance(current, apex_optimizers.FusedAdam) and not isinstance(current, FusedAdam)

    class Sub(apex_optimizers.FusedAdam):
        def __init__(self, params, max_grad_norm=0.0, **kwargs):
            super().__init__(params, **kwargs)
            self.max_grad_norm = max_grad_norm

    assert type(Sub(_params(), max_grad_norm=1.0)) is Sub  # subclasses keep their own constructor


def test_fp16_optimizer_is_also_in_apex_optimizers_and_contrib_exports_apex_names():
    assert apex_optimizers.FP16_Optimizer is FP16_Optimizer
    with apex_aliases():
        contrib = importlib.import_module("apex.contrib.optimizers")
        assert sorted(contrib.__all__) == ["FP16_Optimizer", "FusedAdam", "FusedLAMB"]
        with pytest.raises(ImportError):  # apex's package never exported it; its module has it
            exec("from apex.contrib.optimizers import FusedSGD", {})


def _half_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def _batch(step):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(8, 5, generator=gen), torch.randn(8, 1, generator=gen)


# optimizer for the fp16 model (via FP16_Optimizer), the same rule for the fp32 reference model
FP16_OPTIMIZER_CASES = [
    ("contrib-FusedSGD", lambda p: FusedSGD(p, lr=0.05, momentum=0.9),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("torch-SGD", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    # Adam moves every weight by about lr per step whatever its gradient, so a small lr keeps the
    # fp16-vs-fp32 gradient noise of near-zero gradients inside the tolerance
    ("contrib-FusedAdam", lambda p: FusedAdam(p, lr=1e-3, bias_correction=False),
     lambda p: FusedAdam(p, lr=1e-3, bias_correction=False)),
    ("apexlite-FusedAdam", lambda p: apex_optimizers.FusedAdam(p, lr=1e-3),
     lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0)),
]


@pytest.mark.parametrize("name,make,make_ref", FP16_OPTIMIZER_CASES, ids=[c[0] for c in FP16_OPTIMIZER_CASES])
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static-128"])
def test_fp16_optimizer_trains_an_fp16_model_like_fp32(name, make, make_ref, dynamic):
    ref_model, model = _half_model(), _half_model().half()
    ref_opt = make_ref(list(ref_model.parameters()))
    opt = FP16_Optimizer(make(list(model.parameters())), dynamic_loss_scale=dynamic, static_loss_scale=128.0)
    taken = 0
    for step in range(8):
        x, y = _batch(step)
        opt.zero_grad()
        opt.backward(torch.nn.functional.mse_loss(model(x.half()).float(), y))
        scale = opt.cur_scale
        opt.step()
        if opt.cur_scale < scale:  # an overflow at this scale: the step was skipped, so skip it here too
            continue
        taken += 1
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref_model(x), y).backward()
        ref_opt.step()
    assert taken >= 5
    for half, full in zip(model.parameters(), ref_model.parameters()):
        assert half.dtype is torch.float16
        torch.testing.assert_close(half.float(), full.detach(), atol=1e-2, rtol=1e-2)
    if not dynamic:
        assert opt.cur_scale == 128.0


def test_fp16_optimizer_dynamic_scale_follows_apex_contrib_rules():
    model = torch.nn.Linear(3, 1).half()
    opt = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-3), dynamic_loss_scale=True)
    assert (opt.cur_scale, opt.scale_window, opt.scale_factor) == (2.0 ** 16, 1000, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt.backward(model(torch.full((2, 3), 1e4, dtype=torch.float16)).float().sum())  # fp16 grads overflow
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.cur_scale == 2.0 ** 15 and opt.last_overflow_iter == 0
    opt.scale_window = 3  # apex's attribute; the doubling comes 3 iterations after the overflow
    scales = []
    for _ in range(4):
        opt.zero_grad()
        opt.backward(model(torch.randn(2, 3).half()).float().mean() * 0.01)
        opt.step()
        scales.append(opt.cur_scale)
    assert scales == [2.0 ** 15, 2.0 ** 15, 2.0 ** 16, 2.0 ** 16]


def test_fp16_optimizer_refuses_dynamic_loss_args_like_apex_contrib():
    with pytest.raises(SystemError, match="apex.fp16_utils.FP16_Optimizer"):
        FP16_Optimizer(FusedAdam(_params(), lr=1e-3), dynamic_loss_scale=True, dynamic_loss_args={"init_scale": 8})


def test_fp16_optimizer_state_dict_round_trip_and_lr_through_param_groups():
    model = _half_model().half()
    opt = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-2), dynamic_loss_scale=True)
    for group in opt.param_groups:
        group["lr"] = 5e-3  # 2019 scripts' warmup
    assert opt.optimizer.param_groups[0]["lr"] == 5e-3
    for step in range(2):
        opt.zero_grad()
        opt.backward(model(_batch(step)[0].half()).float().sum())
        opt.step()
    saved = opt.state_dict()
    assert {"cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window", "optimizer_state_dict",
            "fp32_groups", "dynamic_loss_scale"} == set(saved)
    other_model = _half_model().half()
    other = FP16_Optimizer(FusedAdam(other_model.parameters(), lr=1e-2), dynamic_loss_scale=True)
    other.load_state_dict(saved)
    assert other.cur_iter == 2
    for a, b in zip(other.fp32_groups[0], opt.fp32_groups[0]):
        assert torch.equal(a, b)


def test_contrib_fused_sgd_needs_fp16_optimizer_inputs():
    opt = FusedSGD(_params(), lr=0.1)
    with pytest.raises(RuntimeError, match="must be wrapped with apex.contrib.optimizers.FP16_Optimizer"):
        opt.step()


def test_contrib_fused_lamb_is_fused_lamb_without_nvlamb():
    ours, theirs = _params(), _params()
    contrib = FusedLAMB(ours, lr=0.02, weight_decay=0.01)
    current = apex_optimizers.FusedLAMB(theirs, lr=0.02, weight_decay=0.01, use_nvlamb=False)
    for step in range(3):
        for a, b, g in zip(ours, theirs, _tensors(20 + step)):
            a.grad, b.grad = g.clone(), g.clone()
        contrib.step()
        current.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    with pytest.raises(TypeError):
        FusedLAMB(_params(), use_nvlamb=True)  # not part of the 2019 constructor
