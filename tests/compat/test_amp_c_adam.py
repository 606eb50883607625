"""amp_C's Adam kernels against torch.optim.Adam/AdamW and apex's kernel formula, on apexlite's Adam path."""
from __future__ import annotations

import pytest
import torch

from apexlite.compat import amp_C
from apexlite.compat.apex.multi_tensor_apply import multi_tensor_applier
from apexlite.optimizers.multi_tensor import adam as adam_kernels
from tests._helpers import optimizer_refs as ref
from tests._helpers.tolerances import dtype_tols

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SHAPES = [(33, 7), (5,), (2, 3, 4)]
STEPS = 5

# (mode, weight decay, the torch optimizer that runs the same rule)
TORCH_CASES = [
    (0, 0.0, lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-8, foreach=False)),
    (0, 0.1, lambda p: torch.optim.Adam(p, lr=1e-2, eps=1e-8, weight_decay=0.1, foreach=False)),
    (1, 0.1, lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-8, weight_decay=0.1, foreach=False)),
    (1, 0.0, lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-8, weight_decay=0.0, foreach=False)),
]


def _tensors(device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for shape in SHAPES]


def _grads(step, like):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(t.shape, generator=gen).to(device=t.device, dtype=t.dtype) for t in like]


def _flag(device, value=0):
    return torch.tensor([value], dtype=torch.int, device=device)


@pytest.fixture
def adam_paths(monkeypatch):
    """The paths apexlite's fused Adam step took (proves the kernels run on apexlite's one Adam)."""
    taken = []
    real = adam_kernels.fused_adam_step

    def spy(*args, **kwargs):
        taken.append(real(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(adam_kernels, "fused_adam_step", spy)
    return taken


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,wd,make_torch", TORCH_CASES)
def test_multi_tensor_adam_matches_torch_optim(device, mode, wd, make_torch, adam_paths):
    params = _tensors(device)
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    torch_opt = make_torch(torch_params)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    noop = _flag(device)
    for step in range(1, STEPS + 1):
        grads = _grads(step, params)
        multi_tensor_applier(amp_C.multi_tensor_adam, noop, [grads, params, ms, vs], 1e-2, 0.9, 0.999, 1e-8,
                             step, mode, 1, wd)
        for tp, g in zip(torch_params, grads):
            tp.grad = g.clone()
        torch_opt.step()
    for p, tp in zip(params, torch_params):
        torch.testing.assert_close(p, tp.detach(), **dtype_tols(torch.float32))
    assert noop.item() == 0
    assert adam_paths and "reference" not in adam_paths  # apexlite's fused paths, not a private copy


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("dtype,moment_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                                (torch.bfloat16, torch.float32), (torch.float64, torch.float32),
                                                (torch.float32, torch.float16)], ids=str)
def test_multi_tensor_adam_follows_apex_formula_without_bias_correction(mode, dtype, moment_dtype):
    params = _tensors("cpu", dtype)
    ms = [torch.zeros_like(p, dtype=moment_dtype) for p in params]
    vs = [torch.zeros_like(p, dtype=moment_dtype) for p in params]
    expected = [(p.float().clone(), torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32))
                for p in params]
    for step in range(1, STEPS + 1):
        grads = _grads(step, params)
        amp_C.multi_tensor_adam(2048 * 32, _flag("cpu"), [grads, params, ms, vs], 5e-3, 0.8, 0.95, 1e-6, step,
                                mode, 0, 0.05)
        expected = [ref.adam(p, g, m, v, lr=5e-3, beta1=0.8, beta2=0.95, eps=1e-6, step=step, mode=mode,
                             bias_correction=False, wd=0.05) for (p, m, v), g in zip(expected, grads)]
        expected = [(p.to(dtype).float(), m.to(moment_dtype).float(), v.to(moment_dtype).float())
                    for p, m, v in expected]  # what the stored dtypes keep between steps
    tols = dtype_tols(torch.float32 if dtype == torch.float64 else dtype)
    for p, m, (ep, em, _) in zip(params, ms, expected):
        assert p.dtype is dtype and m.dtype is moment_dtype
        torch.testing.assert_close(p.float(), ep, **tols)
        torch.testing.assert_close(m.float(), em, **dtype_tols(moment_dtype))


def test_multi_tensor_adam_ignores_and_keeps_the_noop_flag():
    params = _tensors("cpu")
    before = [p.clone() for p in params]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    noop = _flag("cpu", 1)  # apex's non-capturable kernel does not read it
    amp_C.multi_tensor_adam(65536, noop, [_grads(1, params), params, ms, vs], 1e-2, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    assert noop.item() == 1
    assert all(not torch.equal(a, b) for a, b in zip(params, before))


def _scaled_setup(device, scale):
    params = _tensors(device)
    grads = [g * scale for g in _grads(1, params)]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    return params, grads, ms, vs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,wd,make_torch", TORCH_CASES[1:3])
def test_capturable_unscales_grads_in_place_and_matches_torch(device, mode, wd, make_torch):
    scale = 1024.0
    params, grads, ms, vs = _scaled_setup(device, scale)
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    for tp, g in zip(torch_params, grads):
        tp.grad = g / scale
    make_torch(torch_params).step()
    step = torch.tensor([1], dtype=torch.int, device=device)
    amp_C.multi_tensor_adam_capturable(65536, _flag(device), [grads, params, ms, vs],
                                       torch.tensor(1e-2, device=device), 0.9, 0.999, 1e-8, step, mode, 1, wd,
                                       torch.tensor([1 / scale], device=device))
    for p, tp, g in zip(params, torch_params, grads):
        torch.testing.assert_close(p, tp.detach(), **dtype_tols(torch.float32))
        torch.testing.assert_close(g, tp.grad)  # apex stores the unscaled gradient back
    assert step.item() == 1  # the caller owns the step count


@pytest.mark.parametrize("kernel", ["multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master"])
def test_capturable_kernels_skip_everything_while_the_flag_is_raised(kernel):
    params, grads, ms, vs = _scaled_setup("cpu", 8.0)
    lists = [grads, [p.half() for p in params], ms, vs, params] if kernel.endswith("master") else \
        [grads, params, ms, vs]
    before = [[t.clone() for t in lst] for lst in lists]
    getattr(amp_C, kernel)(65536, _flag("cpu", 1), lists, torch.tensor(1e-2), 0.9, 0.999, 1e-8,
                           torch.tensor([1], dtype=torch.int), 1, 1, 0.0, torch.tensor([0.125]))
    for now, then in zip(lists, before):
        assert all(torch.equal(a, b) for a, b in zip(now, then))


@pytest.mark.parametrize("model_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_capturable_master_steps_masters_and_rounds_params(model_dtype):
    scale = 4.0
    masters = _tensors("cpu")
    model = [m.to(model_dtype) for m in masters]
    grads = [(g * scale).to(model_dtype) for g in _grads(1, masters)]
    torch_params = [torch.nn.Parameter(m.clone()) for m in masters]
    for tp, g in zip(torch_params, grads):
        tp.grad = g.float() / scale
    torch.optim.AdamW(torch_params, lr=1e-2, weight_decay=0.1, foreach=False).step()
    ms, vs = [torch.zeros_like(m) for m in masters], [torch.zeros_like(m) for m in masters]
    amp_C.multi_tensor_adam_capturable_master(65536, _flag("cpu"), [grads, model, ms, vs, masters],
                                              torch.tensor(1e-2), 0.9, 0.999, 1e-8, torch.tensor([1], dtype=torch.int),
                                              1, 1, 0.1, torch.tensor([1 / scale]))
    for master, param, tp in zip(masters, model, torch_params):
        torch.testing.assert_close(master, tp.detach(), **dtype_tols(torch.float32))
        assert torch.equal(param, master.to(model_dtype))


def test_capturable_step_tensor_sets_bias_correction():
    params, grads, ms, vs = _scaled_setup("cpu", 1.0)
    expected = [ref.adam(p, g, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, step=7, mode=0,
                         bias_correction=True, wd=0.0)[0] for p, g, m, v in zip(params, grads, ms, vs)]
    amp_C.multi_tensor_adam_capturable(65536, _flag("cpu"), [grads, params, ms, vs], torch.tensor(1e-2), 0.9,
                                       0.999, 1e-8, torch.tensor([7], dtype=torch.int), 0, 1, 0.0,
                                       torch.tensor([1.0]))
    for p, e in zip(params, expected):
        torch.testing.assert_close(p, e, **dtype_tols(torch.float32))


BAD_CALLS = [
    ("multi_tensor_adam", lambda t: ([t[:1], t, t, t],), ValueError, "size mismatch among tensor lists"),
    ("multi_tensor_adam", lambda t: ([t, t, t],), ValueError, "takes 4 tensor lists"),
    ("multi_tensor_adam", lambda t: ([[], [], [], []],), ValueError, "empty"),
    ("multi_tensor_adam", lambda t: ([[x.int() for x in t], t, t, t],), TypeError, "grads\\[0\\] is torch.int32"),
]


@pytest.mark.parametrize("kernel,lists,error,message", BAD_CALLS)
def test_bad_tensor_lists_are_reported(kernel, lists, error, message):
    tensors = _tensors("cpu")
    with pytest.raises(error, match=message):
        getattr(amp_C, kernel)(65536, _flag("cpu"), *lists(tensors), 1e-3, 0.9, 0.999, 1e-8, 1, 0, 1, 0.0)


def test_unknown_mode_is_refused():
    tensors = _tensors("cpu")
    with pytest.raises(ValueError, match="mode must be 0"):
        amp_C.multi_tensor_adam(65536, _flag("cpu"), [tensors, tensors, tensors, tensors], 1e-3, 0.9, 0.999, 1e-8,
                                1, 2, 1, 0.0)
