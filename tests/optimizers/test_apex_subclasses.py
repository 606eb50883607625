"""Subclasses written against apex's optimizers construct and step on apexlite's.

fairseq's ``FusedAdamV2`` (also in NVIDIA's wav2vec2) is not installable here (fairseq 0.12.2 is a
source distribution that needs compiling), so ``FusedAdamV2Like`` below uses exactly the attributes
and calls it makes: ``self.multi_tensor_adam``, ``self._dummy_overflow_buf``, ``self.adam_w_mode``,
``group["step"]`` / ``group["bias_correction"]``, fp32 copies of fp16 params and grads, and
``multi_tensor_applier``. The apex-style LAMB and SGD subclasses step the way apex's own classes do.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from apexlite.compat import amp_C, apex_aliases
from tests._helpers.tolerances import dtype_tols

with apex_aliases():
    from apex.multi_tensor_apply import multi_tensor_applier
    from apex.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD


class FusedAdamV2Like(FusedAdam):
    """fairseq's pattern: its own step() on apex's kernel, math on fp32 copies of fp16 params."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not hasattr(self, "multi_tensor_adam"):
            raise Exception("Apex installation is outdated. Please install an updated version of apex.")

    def step(self, closure=None, grads=None, output_params=None, scale=None, grad_norms=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            bias_correction = 1 if group["bias_correction"] else 0
            beta1, beta2 = group["betas"]
            group["step"] = group["step"] + 1 if "step" in group else 1
            g_16, p_16, orig_p_16, m_16, v_16 = [], [], [], [], []
            g_32, p_32, m_32, v_32 = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p.data, dtype=torch.float)
                    state["exp_avg_sq"] = torch.zeros_like(p.data, dtype=torch.float)
                if p.dtype == torch.float16:
                    g_16.append(p.grad.data.float())
                    p_16.append(p.data.float())
                    orig_p_16.append(p.data)
                    m_16.append(state["exp_avg"])
                    v_16.append(state["exp_avg_sq"])
                else:
                    g_32.append(p.grad.data)
                    p_32.append(p.data)
                    m_32.append(state["exp_avg"])
                    v_32.append(state["exp_avg_sq"])
            device = group["params"][0].device
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                for g, p, m, v in ((g_16, p_16, m_16, v_16), (g_32, p_32, m_32, v_32)):
                    if g:
                        multi_tensor_applier(self.multi_tensor_adam, self._dummy_overflow_buf, [g, p, m, v],
                                             group["lr"], beta1, beta2, group["eps"], group["step"],
                                             self.adam_w_mode, bias_correction, group["weight_decay"])
                for orig_p, p in zip(orig_p_16, p_16):
                    orig_p.copy_(p.data)
        return loss


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ADAM_MODES = [(False, torch.optim.Adam), (True, torch.optim.AdamW)]


def _params(device, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(device=device, dtype=dtype))
            for shape in [(11, 4), (4,)]]


def _set_grads(step, *param_lists):
    gen = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(p.shape, generator=gen) for p in param_lists[0]]
    for params in param_lists:
        for p, g in zip(params, grads):
            p.grad = g.to(device=p.device, dtype=p.dtype, copy=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("adam_w_mode,torch_class", ADAM_MODES)
def test_fairseq_style_subclass_steps_like_torch_adam(device, adam_w_mode, torch_class):
    ours, theirs = _params(device), _params(device)
    opt = FusedAdamV2Like(ours, lr=1e-2, weight_decay=0.05, adam_w_mode=adam_w_mode)
    ref = torch_class(theirs, lr=1e-2, weight_decay=0.05, foreach=False)
    for step in range(5):
        _set_grads(step, ours, theirs)
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))
    assert opt.param_groups[0]["step"] == 5


def test_fairseq_style_subclass_on_fp16_params_tracks_fp32_adamw():
    ours, theirs = _params("cpu", torch.float16), [torch.nn.Parameter(p.float()) for p in _params("cpu", torch.float16)]
    opt = FusedAdamV2Like(ours, lr=1e-2)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.0, foreach=False)
    for step in range(5):
        _set_grads(step, ours, theirs)
        opt.step()
        ref.step()
        with torch.no_grad():  # what an fp16 param can hold between steps
            for p in theirs:
                p.copy_(p.half())
    for a, b in zip(ours, theirs):
        assert a.dtype is torch.float16
        torch.testing.assert_close(a.float(), b, **dtype_tols(torch.float16))


def test_fairseq_style_subclass_resumes_with_its_group_step():
    straight, resumed = _params("cpu"), _params("cpu")
    opt = FusedAdamV2Like(straight, lr=1e-2)
    first = FusedAdamV2Like(resumed, lr=1e-2)
    for step in range(3):
        _set_grads(step, straight, resumed)
        opt.step()
        first.step()
    second = FusedAdamV2Like(resumed, lr=1e-2)
    second.load_state_dict(first.state_dict())
    assert second.param_groups[0]["step"] == 3  # kept: this subclass's bias correction reads it
    for step in range(3, 5):
        _set_grads(step, straight, resumed)
        opt.step()
        second.step()
    for a, b in zip(straight, resumed):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class ApexStyleLAMB(FusedLAMB):
    """apex's FusedLAMB.step: norms through self.multi_tensor_l2norm, the update through self.multi_tensor_lamb."""

    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        global_norm = multi_tensor_applier(self.multi_tensor_l2norm, self._dummy_overflow_buf, [grads], False)[0]
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    self.state[p]["exp_avg"], self.state[p]["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
            beta1, beta2 = group["betas"]
            multi_tensor_applier(self.multi_tensor_lamb, self._dummy_overflow_buf,
                                 [[p.grad for p in params], params, [self.state[p]["exp_avg"] for p in params],
                                  [self.state[p]["exp_avg_sq"] for p in params]],
                                 group["lr"], beta1, beta2, group["eps"], group["step"], int(group["bias_correction"]),
                                 group["weight_decay"], int(group["grad_averaging"]), self.adam_w_mode, global_norm,
                                 self.defaults["max_grad_norm"], self.use_nvlamb)


class ApexStyleSGD(FusedSGD):
    """apex's FusedSGD.step: momenta from self.get_momentums, the update through self.multi_tensor_sgd."""

    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            momenta, first_run = self.get_momentums(params)
            multi_tensor_applier(self.multi_tensor_sgd, self._dummy_overflow_buf,
                                 [[p.grad for p in params], params, momenta], group["weight_decay"], group["momentum"],
                                 group["dampening"], group["lr"], group["nesterov"], first_run,
                                 self.wd_after_momentum, 1.0 / self.most_recent_scale)


SUBCLASS_CASES = [
    (ApexStyleLAMB, FusedLAMB, dict(lr=0.02, weight_decay=0.01, max_grad_norm=1.0)),
    (ApexStyleLAMB, FusedLAMB, dict(lr=0.02, weight_decay=0.0, use_nvlamb=True, adam_w_mode=False)),
    (ApexStyleSGD, FusedSGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
]


@pytest.mark.parametrize("subclass,base,options", SUBCLASS_CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_apex_style_subclass_steps_like_the_apexlite_class(subclass, base, options):
    ours, theirs = _params("cpu"), _params("cpu")
    opt, ref = subclass(ours, **options), base(theirs, **options)
    for step in range(4):
        _set_grads(step, ours, theirs)
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **dtype_tols(torch.float32))


# class -> (constructor kwargs, {attribute: expected value}); the attributes apex's __init__ sets at e13873de
APEX_ATTRIBUTES = [
    (FusedAdam, {}, {"adam_w_mode": 1, "set_grad_none": True, "capturable": False, "master_weights": False,
                     "multi_tensor_adam": amp_C.multi_tensor_adam,
                     "multi_tensor_adam_capturable": amp_C.multi_tensor_adam_capturable,
                     "multi_tensor_adam_capturable_master": amp_C.multi_tensor_adam_capturable_master}),
    (FusedAdam, {"adam_w_mode": False}, {"adam_w_mode": 0}),
    (FusedLAMB, {}, {"adam_w_mode": 1, "set_grad_none": True, "use_nvlamb": False,
                     "multi_tensor_l2norm": amp_C.multi_tensor_l2norm, "multi_tensor_lamb": amp_C.multi_tensor_lamb}),
    (FusedSGD, {"lr": 0.1}, {"wd_after_momentum": False, "materialize_master_grads": True, "most_recent_scale": 1.0,
                             "scale_set_by_backward": False, "set_grad_none": False,
                             "multi_tensor_sgd": amp_C.multi_tensor_sgd}),
    (FusedNovoGrad, {}, {"moment_mode": 1, "set_grad_none": True, "multi_tensor_novograd": amp_C.multi_tensor_novograd}),
    (FusedNovoGrad, {"reg_inside_moment": True}, {"moment_mode": 0}),
    (FusedAdagrad, {}, {"adagrad_w_mode": 0, "set_grad_none": True, "multi_tensor_adagrad": amp_C.multi_tensor_adagrad}),
    (FusedMixedPrecisionLamb, {}, {"adam_w_mode": 1, "use_nvlamb": False, "reduced_precision_dtype": None,
                                   "_step_supports_amp_scaling": True,
                                   "multi_tensor_l2norm": amp_C.multi_tensor_l2norm_mp,
                                   "multi_tensor_lamb": amp_C.multi_tensor_lamb_mp}),
]


@pytest.mark.parametrize("cls,kwargs,expected", APEX_ATTRIBUTES, ids=lambda x: getattr(x, "__name__", None))
def test_optimizers_carry_apex_instance_attributes(cls, kwargs, expected):
    opt = cls(_params("cpu"), **kwargs)
    for name, value in expected.items():
        actual = getattr(opt, name)
        assert actual is value if callable(value) else actual == value, name
    buf = opt._dummy_overflow_buf
    assert buf.dtype is torch.int32 and buf.shape == (1,) and buf.item() == 0


def test_master_views_list_one_entry_per_param():
    params = _params("cpu", torch.float16)
    opt = FusedAdam(params, master_weights=True, capturable=True)
    _set_grads(0, params)
    opt.step()
    masters = opt.param_groups_master[0]["params"]
    assert [m.dtype for m in masters] == [torch.float32, torch.float32]
    assert all(torch.equal(m.half(), p) for m, p in zip(masters, params))
