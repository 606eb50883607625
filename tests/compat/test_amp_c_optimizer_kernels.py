"""amp_C's SGD, Adagrad, NovoGrad and LAMB kernels against torch.optim and apex's kernel formulas."""
from __future__ import annotations

import pytest
import torch

from apexlite.compat import amp_C
from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier
from tests._helpers import optimizer_refs as ref
from tests._helpers.tolerances import dtype_tols

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [(17, 5), (9,), (3, 2, 2)]
FP32 = dtype_tols(torch.float32)


def _tensors(device="cpu", dtype=torch.float32, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for shape in shapes]


def _flag(device="cpu", value=0):
    return torch.tensor([value], dtype=torch.int, device=device)


def _close(actual, expected, dtype=torch.float32):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float(), e.float(), **dtype_tols(dtype))


# --- SGD -------------------------------------------------------------------------------------------------------

SGD_TORCH_CASES = [dict(momentum=0.0), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3, weight_decay=0.01),
                   dict(momentum=0.8, nesterov=True, weight_decay=0.1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", SGD_TORCH_CASES, ids=str)
def test_multi_tensor_sgd_matches_torch_sgd(device, options):
    weights = _tensors(device)
    torch_params = [torch.nn.Parameter(w.clone()) for w in weights]
    torch_opt = torch.optim.SGD(torch_params, lr=0.1, foreach=False, **options)
    momenta = [torch.zeros_like(w) for w in weights]
    for step in range(4):
        grads = _tensors(device, seed=10 + step)
        multi_tensor_applier(amp_C.multi_tensor_sgd, _flag(device), [grads, weights, momenta],
                             options.get("weight_decay", 0.0), options["momentum"], options.get("dampening", 0.0),
                             0.1, options.get("nesterov", False), step == 0, False, 1.0)
        for tp, g in zip(torch_params, grads):
            tp.grad = g
        torch_opt.step()
    _close(weights, [tp.detach() for tp in torch_params])


@pytest.mark.parametrize("grad_dtype", [torch.float16, torch.float32], ids=str)
def test_multi_tensor_sgd_fp32_weights_write_half_model_copies(grad_dtype):
    weights = _tensors()
    copies = [w.half() for w in weights]
    momenta = [torch.zeros_like(w) for w in weights]
    expected = [(w.clone(), None) for w in weights]
    for step in range(3):
        grads = [g.to(grad_dtype) for g in _tensors(seed=20 + step)]
        amp_C.multi_tensor_sgd(65536, _flag(), [grads, weights, momenta, copies], 0.05, 0.9, 0.1, 0.2, False,
                               step == 0, True, 0.5)
        expected = [ref.sgd(w, g, b, lr=0.2, momentum=0.9, dampening=0.1, wd=0.05, nesterov=False,
                            wd_after_momentum=True, scale=0.5) for (w, b), g in zip(expected, grads)]
    _close(weights, [w for w, _ in expected])
    assert all(torch.equal(c, w.half()) for c, w in zip(copies, weights))


def test_multi_tensor_sgd_skips_while_the_flag_is_raised():
    weights, momenta = _tensors(), [torch.ones(s) for s in SHAPES]
    before = [w.clone() for w in weights]
    amp_C.multi_tensor_sgd(65536, _flag(value=1), [_tensors(seed=3), weights, momenta], 0.0, 0.9, 0.0, 0.1, False,
                           False, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(weights, before))
    assert all(torch.equal(m, torch.ones_like(m)) for m in momenta)


def test_multi_tensor_sgd_rejects_float32_model_copies():
    tensors = _tensors()
    with pytest.raises(TypeError, match="model copies"):
        amp_C.multi_tensor_sgd(65536, _flag(), [tensors, tensors, tensors, tensors], 0.0, 0.0, 0.0, 0.1, False,
                               True, False, 1.0)


# --- Adagrad ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_multi_tensor_adagrad_l2_mode_matches_torch_adagrad(device, wd):
    params = _tensors(device)
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    torch_opt = torch.optim.Adagrad(torch_params, lr=0.1, eps=1e-10, weight_decay=wd, foreach=False)
    sums = [torch.zeros_like(p) for p in params]
    for step in range(4):
        grads = _tensors(device, seed=30 + step)
        amp_C.multi_tensor_adagrad(65536, _flag(device), [grads, params, sums], 0.1, 1e-10, 0, wd)
        for tp, g in zip(torch_params, grads):
            tp.grad = g
        torch_opt.step()
    _close(params, [tp.detach() for tp in torch_params])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_multi_tensor_adagrad_decoupled_mode_follows_apex_formula(dtype):
    params, sums = _tensors(dtype=dtype), [torch.zeros(s, dtype=dtype) for s in SHAPES]
    expected = [(p.float().clone(), torch.zeros(p.shape)) for p in params]
    for step in range(3):
        grads = _tensors(dtype=dtype, seed=40 + step)
        amp_C.multi_tensor_adagrad(65536, _flag(), [grads, params, sums], 0.1, 1e-8, 1, 0.2)
        expected = [ref.adagrad(p, g, h, lr=0.1, eps=1e-8, mode=1, wd=0.2) for (p, h), g in zip(expected, grads)]
        expected = [(p.to(dtype).float(), h.to(dtype).float()) for p, h in expected]
    _close(params, [p for p, _ in expected], dtype)


# --- NovoGrad --------------------------------------------------------------------------------------------------

NOVOGRAD_CASES = [
    dict(mode=1, norm_type=2, bias_correction=True, grad_averaging=True, wd=0.0),
    dict(mode=1, norm_type=0, bias_correction=True, grad_averaging=True, wd=0.01),
    dict(mode=0, norm_type=2, bias_correction=False, grad_averaging=False, wd=0.01),
    dict(mode=0, norm_type=0, bias_correction=True, grad_averaging=False, wd=0.1),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", NOVOGRAD_CASES, ids=str)
def test_multi_tensor_novograd_follows_apex_formula(device, case):
    params, moments = _tensors(device), [torch.zeros(s, device=device) for s in SHAPES]
    norms = torch.rand(len(SHAPES), device=device)
    exp_p, exp_m, exp_n = [p.cpu().clone() for p in params], [m.cpu().clone() for m in moments], norms.cpu().clone()
    for step in range(1, 4):
        grads = _tensors(device, seed=50 + step)
        hyper = dict(lr=0.01, beta1=0.9, beta2=0.7, eps=1e-8, step=step, bias_correction=case["bias_correction"],
                     wd=case["wd"], grad_averaging=case["grad_averaging"], mode=case["mode"],
                     norm_type=case["norm_type"])
        exp_p, exp_m, exp_n = ref.novograd(exp_p, [g.cpu() for g in grads], exp_m, exp_n, **hyper)
        amp_C.multi_tensor_novograd(65536, _flag(device), [grads, params, moments], norms, 0.01, 0.9, 0.7, 1e-8,
                                    step, int(case["bias_correction"]), case["wd"], int(case["grad_averaging"]),
                                    case["mode"], case["norm_type"])
    torch.testing.assert_close(norms.cpu(), exp_n, **FP32)
    _close([p.cpu() for p in params], exp_p)
    _close([m.cpu() for m in moments], exp_m)


def test_multi_tensor_novograd_raises_the_flag_on_non_finite_grads():
    params, moments, norms = _tensors(), [torch.zeros(s) for s in SHAPES], torch.ones(len(SHAPES))
    grads = _tensors(seed=3)
    grads[1][0] = float("inf")
    flag = _flag()
    amp_C.multi_tensor_novograd(65536, flag, [grads, params, moments], norms, 0.01, 0.9, 0.7, 1e-8, 1, 1, 0.0, 1, 1, 2)
    assert flag.item() == 1


# --- LAMB ------------------------------------------------------------------------------------------------------

LAMB_CASES = [
    dict(mode=1, wd=0.01, use_nvlamb=False, grad_averaging=True, bias_correction=True, max_norm=1.0),
    dict(mode=0, wd=0.01, use_nvlamb=False, grad_averaging=False, bias_correction=True, max_norm=1.0),
    dict(mode=1, wd=0.0, use_nvlamb=True, grad_averaging=True, bias_correction=False, max_norm=100.0),
    dict(mode=1, wd=0.0, use_nvlamb=False, grad_averaging=True, bias_correction=True, max_norm=0.5),
]


def _global_norm(grads):
    return torch.stack([g.float().norm() for g in grads]).norm()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", LAMB_CASES, ids=str)
def test_multi_tensor_lamb_follows_apex_formula_and_leaves_updates_in_grads(device, case):
    params = _tensors(device)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    exp_p, exp_m, exp_v = ([t.cpu().clone() for t in params], [t.cpu().clone() for t in ms],
                           [t.cpu().clone() for t in vs])
    for step in range(1, 4):
        grads = _tensors(device, seed=60 + step)
        norm = _global_norm(grads)
        exp_p, exp_m, exp_v, updates = ref.lamb(
            exp_p, [g.cpu() for g in grads], exp_m, exp_v, lr=0.02, beta1=0.9, beta2=0.999, eps=1e-6, step=step,
            bias_correction=case["bias_correction"], wd=[case["wd"]] * len(params),
            grad_averaging=case["grad_averaging"], mode=case["mode"], global_norm=float(norm),
            max_norm=case["max_norm"], use_nvlamb=case["use_nvlamb"])
        amp_C.multi_tensor_lamb(65536, _flag(device), [grads, params, ms, vs], 0.02, 0.9, 0.999, 1e-6, step,
                                int(case["bias_correction"]), case["wd"], int(case["grad_averaging"]), case["mode"],
                                norm, case["max_norm"], case["use_nvlamb"])
        _close([g.cpu() for g in grads], updates)  # apex leaves the update direction in the grads
    _close([p.cpu() for p in params], exp_p)
    _close([m.cpu() for m in ms], exp_m)


def test_lamb_stages_follow_apex_formula_with_per_tensor_decay():
    params = _tensors()
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    updates = [torch.empty_like(p) for p in params]
    decay = torch.tensor([0.0, 0.1, 0.02])
    grads = _tensors(seed=70)
    norm = _global_norm(grads)
    exp_p, exp_m, _, exp_u = ref.lamb(params, grads, ms, vs, lr=0.05, beta1=0.9, beta2=0.99, eps=1e-6, step=3,
                                      bias_correction=True, wd=decay.tolist(), grad_averaging=True, mode=1,
                                      global_norm=float(norm), max_norm=0.5, use_nvlamb=False,
                                      adaptive_when=True)
    flag = _flag()
    amp_C.multi_tensor_lamb_stage1_cuda(65536, flag, [grads, params, ms, vs, updates], decay, 2, 0.9, 0.99, 1e-6,
                                        norm, 0.5)  # step 2 finished: this is step 3
    _close(updates, exp_u)
    _close(ms, exp_m)
    _, param_norms = amp_C.multi_tensor_l2norm(65536, flag, [params], True)
    _, update_norms = amp_C.multi_tensor_l2norm(65536, flag, [updates], True)
    amp_C.multi_tensor_lamb_stage2_cuda(65536, flag, [params, updates], param_norms, update_norms, 0.05, 0.1)
    _close(params, exp_p)


@pytest.mark.parametrize("masters", [False, True], ids=["fp32-params", "fp16-model-fp32-masters"])
def test_multi_tensor_lamb_mp_unscales_clips_and_writes_model_copies(masters):
    scale = 512.0
    fp32 = _tensors()
    grads = [(g * scale).half() if masters else g * scale for g in _tensors(seed=80)]
    ms, vs = [torch.zeros_like(p) for p in fp32], [torch.zeros_like(p) for p in fp32]
    unscaled = [g.float() / scale for g in grads]
    exp_p, *_ = ref.lamb(fp32, unscaled, ms, vs, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, step=4,
                         bias_correction=True, wd=[0.01] * 3, grad_averaging=True, mode=1,
                         global_norm=float(_global_norm(unscaled)), max_norm=1.0, use_nvlamb=False)
    lists = [grads, fp32, ms, vs] + ([[p.half() for p in fp32]] if masters else [])
    scaled_norm = _global_norm(grads)  # apex's optimizer passes the norm and max of the scaled grads
    amp_C.multi_tensor_lamb_mp(65536, _flag(), lists, torch.tensor(0.01), 0.9, 0.999, 1e-6,
                               torch.tensor([4], dtype=torch.int), 1, 0.01, 1, 1, scaled_norm,
                               torch.tensor(1.0 * scale), False, torch.zeros(1), torch.tensor([1 / scale]))
    _close(fp32, exp_p)
    if masters:
        assert all(torch.equal(model, p.half()) for model, p in zip(lists[4], fp32))


def test_multi_tensor_lamb_mp_skips_while_the_flag_is_raised():
    params, grads = _tensors(), _tensors(seed=5)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    before = [t.clone() for t in params + grads]
    amp_C.multi_tensor_lamb_mp(65536, _flag(value=1), [grads, params, ms, vs], torch.tensor(0.01), 0.9, 0.999, 1e-6,
                               torch.tensor([1], dtype=torch.int), 1, 0.01, 1, 1, torch.tensor(1.0), torch.tensor(1.0),
                               False, torch.ones(1), torch.ones(1))
    assert all(torch.equal(a, b) for a, b in zip(params + grads, before))


def test_lamb_kernels_raise_the_flag_on_non_finite_grads():
    params, grads = _tensors(), _tensors(seed=5)
    grads[0][0, 0] = float("nan")
    flag = _flag()
    amp_C.multi_tensor_lamb(65536, flag, [grads, params, [torch.zeros_like(p) for p in params],
                                          [torch.zeros_like(p) for p in params]], 0.01, 0.9, 0.999, 1e-6, 1, 1, 0.01,
                            1, 1, torch.tensor(1.0), 1.0, False)
    assert flag.item() == 1


def test_lamb_mode_must_be_known():
    tensors = _tensors()
    with pytest.raises(ValueError, match="mode must be 0"):
        amp_C.multi_tensor_lamb(65536, _flag(), [tensors] * 4, 0.01, 0.9, 0.999, 1e-6, 1, 1, 0.0, 1, 5,
                                torch.tensor(1.0), 1.0)
