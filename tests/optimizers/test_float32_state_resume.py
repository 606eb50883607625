"""Optimizers that keep float32 state for float16/bfloat16 params keep it float32 through a checkpoint.

torch's load casts state to each param's dtype: a resumed FusedAdagrad's sum of squares of a float16
param became inf (the param then never moved again), and LAMB's and NovoGrad's moments lost precision,
so a resumed run parted from an uninterrupted one.
"""
import io

import pytest
import torch

from apexlite.optimizers import FusedAdagrad, FusedLAMB, FusedNovoGrad, FusedSGD

OPTIMIZERS = {"FusedAdagrad": (FusedAdagrad, dict(lr=1e-2)), "FusedLAMB": (FusedLAMB, dict(lr=1e-2)),
              "FusedNovoGrad": (FusedNovoGrad, dict(lr=1e-2))}


def _params(dtype):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3).to(dtype)), torch.nn.Parameter(torch.randn(4).to(dtype))]


def _steps(optimizer, params, count, first, scale):
    for index in range(first, first + count):
        generator = torch.Generator().manual_seed(index)
        for param in params:
            param.grad = (torch.randn(param.shape, generator=generator) * scale).to(param.dtype)
        optimizer.step()


def _resumed(cls, options, params):
    """A new optimizer over copies of `params` (to load a checkpoint into)."""
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    return copies, cls(copies, **options)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_resumed_run_equals_an_uninterrupted_one(name, dtype):
    cls, options = OPTIMIZERS[name]
    straight = _params(dtype)
    optimizer = cls(straight, **options)
    _steps(optimizer, straight, 3, 0, 100.0)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    resumed, again = _resumed(cls, options, straight)
    buffer.seek(0)
    again.load_state_dict(torch.load(buffer))
    floating = [value for state in again.state.values() for key, value in state.items()
                if torch.is_tensor(value) and value.is_floating_point() and key != "step"]
    assert floating and all(value.dtype == torch.float32 for value in floating)
    _steps(optimizer, straight, 3, 3, 100.0)
    _steps(again, resumed, 3, 3, 100.0)
    for expected, got in zip(straight, resumed):
        assert torch.equal(expected, got)


def test_a_resumed_adagrad_sum_above_the_float16_range_still_moves_its_param():
    param = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    optimizer = FusedAdagrad([param], lr=1e-2)
    for _ in range(10):
        param.grad = torch.full_like(param, 100.0)
        optimizer.step()
    assert optimizer.state[param]["sum"].dtype == torch.float32 and optimizer.state[param]["sum"][0] == 1e5
    again = FusedAdagrad([param], lr=1e-2)
    again.load_state_dict(optimizer.state_dict())
    assert torch.isfinite(again.state[param]["sum"]).all()
    before = param.detach().clone()
    param.grad = torch.full_like(param, 100.0)
    again.step()
    assert (param < before).all()


def test_sgd_momentum_keeps_the_params_dtype_as_before():
    """FusedSGD keeps its momentum in the param's dtype (as apex): loading leaves it so."""
    params = _params(torch.float16)
    optimizer = FusedSGD(params, lr=0.1, momentum=0.9)
    _steps(optimizer, params, 2, 0, 1.0)
    copies, again = _resumed(FusedSGD, dict(lr=0.1, momentum=0.9), params)
    again.load_state_dict(optimizer.state_dict())
    assert {value["momentum_buffer"].dtype for value in again.state.values()} == {torch.float16}
