"""Probe: weights written through `.data` must never be served from a stale cast (issue: EMA/SWA swaps).

`p.data.copy_(w)` and `p.data = w` change no autograd version counter, so a cache keyed only on it
served the old fp16 copy on the next forward. Every case compares the O1 output with the same ops
applied by hand to the weights' *current* values (exact for bf16: one rounding either way).
"""
import copy

import pytest
import torch

from apexlite import amp

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

DTYPE = torch.bfloat16


def expected_output(model, x):
    """The O1 result computed by hand from the current weights: bf16 casts, then the same ops."""
    hidden = torch.nn.functional.linear(x.to(DTYPE), model[0].weight.detach().to(DTYPE), model[0].bias.detach().to(DTYPE))
    hidden = torch.relu(hidden)
    return torch.nn.functional.linear(hidden, model[2].weight.detach().to(DTYPE), model[2].bias.detach().to(DTYPE))


def swap_copy(model, source):
    for p, q in zip(model.parameters(), source.parameters()):
        p.data.copy_(q.data)


def swap_assign(model, source):
    for p, q in zip(model.parameters(), source.parameters()):
        p.data = q.data.clone()


def clamp_in_place(model, _source):
    for p in model.parameters():
        p.data.clamp_(-0.01, 0.01)  # WGAN-style clipping outside the optimizer


WRITES = {"data_copy": swap_copy, "data_assign": swap_assign, "data_clamp": clamp_in_place}


@pytest.fixture
def o1_pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    shadow = copy.deepcopy(model)  # e.g. an EMA copy, very different weights
    with torch.no_grad():
        for p in shadow.parameters():
            p.mul_(-3.0).add_(1.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", dtype=DTYPE, verbosity=0)
    yield model, shadow, opt
    amp.deinitialize()


@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
@pytest.mark.parametrize("grad_mode", ["no_grad", "grad"])
def test_forward_after_a_data_write_uses_the_new_values(o1_pair, write, grad_mode):
    model, shadow, _ = o1_pair
    x = torch.randn(5, 8)
    context = torch.no_grad if grad_mode == "no_grad" else torch.enable_grad
    with context():
        before = model(x)
        write(model, shadow)
        after = model(x)
    assert torch.equal(before.detach(), expected_output(model, x)) is False  # the write did change the result
    assert torch.equal(after.detach(), expected_output(model, x))


def test_ema_swap_for_evaluation_and_back(o1_pair):
    """Train step, swap EMA weights in for a no_grad eval, swap back, train again: every result fresh."""
    model, shadow, opt = o1_pair
    x = torch.randn(5, 8)
    backup = copy.deepcopy(model)
    with amp.scale_loss(model(x).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
    opt.step()
    with torch.no_grad():
        model(x)  # an eval forward that fills the cache with the trained weights' casts
        swap_copy(backup, model)
        swap_copy(model, shadow)
        ema_out = model(x)
        swap_copy(model, backup)
        trained_out = model(x)
    assert torch.equal(ema_out, expected_output(shadow, x))
    assert torch.equal(trained_out, expected_output(model, x))


def test_functional_use_without_a_model_scope_is_fresh_after_a_version_or_pointer_change(o1_pair):
    """Outside a registered model's forward the cache lives until scale_loss/step; it still checks the
    weight's version counter and data pointer on every hit."""
    model, shadow, _ = o1_pair
    layer = model[0]
    x = torch.randn(5, 8)
    first = torch.nn.functional.linear(x, layer.weight, layer.bias)
    layer.weight.data = shadow[0].weight.data.clone()
    second = torch.nn.functional.linear(x, layer.weight, layer.bias)
    expected = torch.nn.functional.linear(x.to(DTYPE), layer.weight.detach().to(DTYPE), layer.bias.detach().to(DTYPE))
    assert not torch.equal(first, second)
    assert torch.equal(second.detach(), expected)
