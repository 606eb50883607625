"""FusedAdam.zero_grad against torch.optim.Optimizer.zero_grad on the same model.

FusedAdam clears the grads of params in flat buffers without Python work per param (dropped, or, kept,
zeroed in one fill per grad buffer); what a user sees must be torch's: which grads are None, which are
zero tensors and whether they are the same objects, their versions, views of them, params outside the
buffers, an edited params list, zero_grad between forward and backward, and training afterwards.
Every case runs with apexlite._C.flat_zero_grads and with its Python twin (the grad_pass fixture).
"""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdam, _flat_buffers
from tests.optimizers.flat_helpers import HYPER, grad_pass  # noqa: F401 (grad_pass: a fixture)

SET_TO_NONE = [True, False]


def _model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 3)).to(device)


def _backward(model, seed):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(5, 6, generator=gen), torch.randn(5, 3, generator=gen)
    device = next(model.parameters()).device
    torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()


def _pair(device="cpu", **kw):
    """(model, FusedAdam) and (model, torch AdamW), the same weights, each stepped once (buffers built)."""
    runs = []
    for make in (lambda p: FusedAdam(p, **HYPER, **kw), lambda p: torch.optim.AdamW(p, **HYPER)):
        model = _model(device=device)
        opt = make(model.parameters())
        _backward(model, 0)
        opt.step()
        runs.append((model, opt))
    return runs


def _grads(model):
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _same_grads(a, b):
    assert [g is None for g in a] == [g is None for g in b]
    for x, y in zip(a, b):
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_grads_after_zero_grad_are_torchs(grad_pass, set_to_none):
    (model, opt), (ref_model, ref_opt) = _pair()
    objects = [p.grad for p in model.parameters()]
    versions = [g._version for g in objects]
    ref_versions = [p.grad._version for p in ref_model.parameters()]
    opt.zero_grad(set_to_none=set_to_none)
    ref_opt.zero_grad(set_to_none=set_to_none)
    _same_grads(_grads(model), _grads(ref_model))
    if not set_to_none:
        assert all(p.grad is g for p, g in zip(model.parameters(), objects))  # kept, as torch keeps them
        advanced = [p.grad._version - v for p, v in zip(ref_model.parameters(), ref_versions)]
        assert [p.grad._version - v for p, v in zip(model.parameters(), versions)] == advanced


def test_the_default_is_set_grad_none(grad_pass):
    for set_grad_none in (True, False):
        model = _model()
        opt = FusedAdam(model.parameters(), set_grad_none=set_grad_none, **HYPER)
        _backward(model, 0)
        opt.step()
        opt.zero_grad()
        assert all((p.grad is None) == set_grad_none for p in model.parameters())


def test_kept_grads_are_zeroed_in_one_fill_and_stay_in_the_buffer(grad_pass, monkeypatch):
    (model, opt), _ = _pair()
    storage = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storage) == 1  # the step moved them into one grad buffer
    cleared_one_by_one = []
    monkeypatch.setattr("apexlite.optimizers.fused_adam.clear_grads",
                        lambda params, *a: cleared_one_by_one.extend(params))
    opt.zero_grad(set_to_none=False)
    assert cleared_one_by_one == []
    assert {p.grad.untyped_storage().data_ptr() for p in model.parameters()} == storage
    assert all(not p.grad.any() for p in model.parameters())


def test_a_view_of_a_kept_grad_sees_the_zeros_as_with_torch(grad_pass):
    (model, opt), (ref_model, ref_opt) = _pair()
    view, ref_view = next(model.parameters()).grad[0], next(ref_model.parameters()).grad[0]
    opt.zero_grad(set_to_none=False)
    ref_opt.zero_grad(set_to_none=False)
    torch.testing.assert_close(view, ref_view, rtol=0, atol=0)
    assert not view.any()


@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_a_replaced_grad_and_a_param_outside_the_buffers_are_cleared_as_torch_does(grad_pass, set_to_none):
    runs = []
    for make in (lambda p: FusedAdam(p, **HYPER), lambda p: torch.optim.AdamW(p, **HYPER)):
        model = _model()
        extra = torch.nn.Parameter(torch.randn(4, 6)[:, ::2])  # a strided slice: never flattened
        opt = make(list(model.parameters()) + [extra])
        _backward(model, 0)
        extra.grad = torch.ones_like(extra)
        opt.step()
        model[0].weight.grad = torch.full_like(model[0].weight, 3.0)  # no longer in the grad buffer
        runs.append((model, extra, opt))
    for model, extra, opt in runs:
        opt.zero_grad(set_to_none=set_to_none)
    (model, extra, _), (ref_model, ref_extra, _) = runs
    _same_grads(_grads(model) + [extra.grad], _grads(ref_model) + [ref_extra.grad])


@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_a_param_taken_out_of_the_group_keeps_its_grad(grad_pass, set_to_none):
    (model, opt), (ref_model, ref_opt) = _pair()
    for o in (opt, ref_opt):
        o.param_groups[0]["params"] = o.param_groups[0]["params"][1:]  # torch clears only the group's params
    opt.zero_grad(set_to_none=set_to_none)
    ref_opt.zero_grad(set_to_none=set_to_none)
    _same_grads(_grads(model), _grads(ref_model))
    assert next(model.parameters()).grad is not None and next(model.parameters()).grad.any()


def _train_like_torch(set_to_none, device="cpu"):
    (model, opt), (ref_model, ref_opt) = _pair(device)
    for step in range(1, 4):
        for m, o in ((model, opt), (ref_model, ref_opt)):
            gen = torch.Generator().manual_seed(step)
            x, y = torch.randn(5, 6, generator=gen).to(device), torch.randn(5, 3, generator=gen).to(device)
            loss = torch.nn.functional.mse_loss(m(x), y)
            o.zero_grad(set_to_none=set_to_none)
            loss.backward()
            _backward(m, 10 + step)  # a second backward accumulates into the kept (or fresh) grads
            o.step()
    for p, r in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
    opt.zero_grad(set_to_none=set_to_none)
    ref_opt.zero_grad(set_to_none=set_to_none)
    _same_grads(_grads(model), _grads(ref_model))


@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_zero_grad_between_forward_and_backward_then_training_matches_torch(grad_pass, set_to_none):
    """The params' versions are left alone: a backward after zero_grad still runs (torch's common order)."""
    _train_like_torch(set_to_none)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_on_cuda_zero_grad_and_training_match_torch(grad_pass, set_to_none):
    """The same on a GPU: the kept grads are zeroed by one fill on the device."""
    _train_like_torch(set_to_none, "cuda")


def test_without_flat_buffers_zero_grad_is_torchs_loop(monkeypatch):
    model = _model()
    opt = FusedAdam(model.parameters(), flat_buffers=False, **HYPER)
    _backward(model, 0)
    opt.step()
    called = []
    monkeypatch.setattr(_flat_buffers, "flat_zero_grads", lambda *a: called.append(a) or 0)
    opt.zero_grad(set_to_none=False)
    assert called == [] and all(p.grad is not None and not p.grad.any() for p in model.parameters())


class _OddLayouts(torch.nn.Module):
    """A channels_last conv weight and a transposed (dense, non-contiguous) weight: flat buffers keep
    each param's strides, so the grads the fill zeroes are laid out like them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.proj = torch.nn.Parameter(torch.randn(5, 4).t())

    def forward(self, x):
        return self.conv(x.to(memory_format=torch.channels_last)).mean((2, 3)) @ self.proj


@pytest.mark.parametrize("set_to_none", SET_TO_NONE)
def test_params_of_other_layouts_are_cleared_and_trained_as_torch_does(grad_pass, set_to_none):
    runs = []
    for make in (lambda p: FusedAdam(p, **HYPER), lambda p: torch.optim.AdamW(p, **HYPER)):
        model = _OddLayouts()
        assert not model.proj.is_contiguous() and model.conv.weight.is_contiguous(memory_format=torch.channels_last)
        opt = make(model.parameters())
        for step in range(3):
            gen = torch.Generator().manual_seed(step)
            opt.zero_grad(set_to_none=set_to_none)
            model(torch.randn(2, 3, 6, 6, generator=gen)).square().mean().backward()
            opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        runs.append(model)
    _same_grads(_grads(runs[0]), _grads(runs[1]))
    for p, r in zip(runs[0].parameters(), runs[1].parameters()):
        assert p.stride() == r.stride()
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)
