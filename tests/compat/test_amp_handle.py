"""The pre-2019 handle API (`handle = amp.init()`), as apex's own L0 tests and early scripts use it."""
import pytest
import torch
import torch.nn.functional as F

from apexlite.amp.handle import AmpHandle, NoOpHandle, OptimWrapper
from apexlite.amp.session import current_session
from apexlite.compat.hook import apex_aliases

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts


@pytest.fixture(params=["apex.amp", "apexlite.amp"])
def amp(request):
    """apex's amp under the alias, and apexlite.amp (a script whose import became `from apexlite import amp`)."""
    if request.param == "apexlite.amp":
        from apexlite import amp as apexlite_amp

        yield apexlite_amp
        apexlite_amp.deinitialize()
        return
    with apex_aliases():
        from apex import amp as legacy_amp

        yield legacy_amp
        legacy_amp.deinitialize()


def test_init_casts_like_o1_and_deactivate_restores_torch(amp):
    original = F.linear
    handle = amp.init(enabled=True)
    assert isinstance(handle, AmpHandle) and handle.is_active() and amp._amp_state.handle is handle
    layer = torch.nn.Linear(4, 4)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(2, 4, dtype=dtype, requires_grad=True)
        assert layer(x).dtype is torch.float16
        assert F.softmax(x, dim=1).dtype is torch.float32
        layer(x).float().sum().backward()
        assert x.grad.dtype is dtype
    handle._deactivate()
    assert not handle.is_active() and F.linear is original
    assert current_session(required=False) is None  # nothing but amp.init was there: all closed


def test_banned_functions_raise_unless_allow_banned(amp):
    target = torch.rand(3, 1)
    probs = torch.rand(3, 1).half()
    handle = amp.init(enabled=True)
    with pytest.raises(NotImplementedError, match="allow_banned=True"):
        F.binary_cross_entropy(probs, target)
    with pytest.raises(NotImplementedError):
        torch.nn.BCELoss()(probs, target)
    handle._deactivate()
    handle = amp.init(enabled=True, allow_banned=True)
    out = F.binary_cross_entropy(probs, target)
    assert out.dtype is torch.float32
    torch.testing.assert_close(out, F.binary_cross_entropy(probs.float(), target))
    handle._deactivate()


def test_the_banned_message_names_registration_as_a_fix_that_works_with_initialize(amp):
    amp.register_float_function(torch.nn.functional, "binary_cross_entropy")
    model = torch.nn.Linear(4, 1)
    amp.initialize(model, opt_level="O1", verbosity=0)
    out = F.binary_cross_entropy(torch.sigmoid(model(torch.randn(3, 4))), torch.rand(3, 1))
    assert out.dtype is torch.float32


def test_handle_scale_loss_unscales_and_skips_overflowing_steps(amp):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = amp.init(enabled=True)
    x = torch.randn(3, 4)
    loss = model(x).float().pow(2).mean()
    with handle.scale_loss(loss, opt) as scaled:
        assert scaled.item() == pytest.approx(loss.item() * 2.0 ** 16, rel=1e-3)
        scaled.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).float().pow(2).mean().backward()  # same O1 forward, no scaling
    for a, b in zip(grads, model.parameters()):
        torch.testing.assert_close(a, b.grad, rtol=1e-3, atol=1e-5)
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    weights = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    opt.zero_grad()
    with handle.scale_loss(model(x).float().pow(2).mean(), opt) as scaled:
        scaled.backward()
        model.weight.grad[0, 0] = float("inf")
    weights = [p.detach().clone() for p in model.parameters()]
    opt.step()  # skipped
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert handle._default_scaler.loss_scale() == 2.0 ** 15
    handle._deactivate()


def test_wrap_optimizer_two_losses_each_scaled_and_a_skip_on_any_overflow(amp):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = amp.init(enabled=True)
    wrapped = handle.wrap_optimizer(opt, num_loss=2)
    assert isinstance(wrapped, OptimWrapper) and wrapped.param_groups is opt.param_groups
    x = torch.randn(3, 4) * 0.1  # scaled grads stay inside fp16's range
    expected = torch.zeros_like(model.weight)
    for scale in (1.0, 3.0):  # what an unscaled backward of both losses accumulates
        w = model.weight.detach().requires_grad_()
        (F.linear(x.half(), w.half(), model.bias.detach().half()).float().pow(2).mean() * scale).backward()
        expected += w.grad
    for scale in (1.0, 3.0):
        with wrapped.scale_loss(model(x).float().pow(2).mean() * scale) as scaled:
            scaled.backward()
    torch.testing.assert_close(model.weight.grad, expected, rtol=1e-3, atol=1e-5)
    with pytest.raises(RuntimeError, match="num_loss=2"):
        with wrapped.scale_loss(model(x).float().sum()):
            pass
    with pytest.raises(RuntimeError, match="wrap_optimizer"):
        with handle.scale_loss(model(x).float().sum(), opt):
            pass
    wrapped.step()
    wrapped.zero_grad()
    with wrapped.scale_loss(model(x).float().mean()) as scaled:
        scaled.backward()
    with wrapped.scale_loss(model(x).float().mean()) as scaled:
        scaled.backward()
        model.bias.grad[0] = float("nan")
    weights = [p.detach().clone() for p in model.parameters()]
    wrapped.step()  # the second loss overflowed: skipped
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert [s.loss_scale() for s in wrapped._loss_scaler] == [2.0 ** 16, 2.0 ** 15]
    with pytest.raises(NotImplementedError, match="closure"):
        wrapped.step(closure=lambda: 0.0)
    handle._deactivate()


def test_cache_controls(amp):
    handle = amp.init(enabled=True)
    layer = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    with handle.scale_loss(layer(torch.randn(2, 4)).float().sum(), opt) as scaled:
        scaled.backward()  # registers the optimizer: its params' casts are held between calls
    layer(torch.randn(2, 4))
    assert handle.has_cache and layer.weight in handle.cache
    handle.remove_cache(layer.weight)
    assert layer.weight not in handle.cache and layer.bias in handle.cache
    handle._clear_cache()
    assert len(handle.cache) == 0
    handle._deactivate()
    handle = amp.init(enabled=True, enable_caching=False)
    layer(torch.randn(2, 4))
    assert not handle.has_cache and len(handle.cache) == 0
    handle._deactivate()


def test_handle_disable_casts_and_noop_handle(amp):
    handle = amp.init(enabled=True)
    layer = torch.nn.Linear(4, 4)
    with handle._disable_casts():
        assert layer(torch.randn(2, 4)).dtype is torch.float32
    assert layer(torch.randn(2, 4)).dtype is torch.float16
    handle._deactivate()
    noop = amp.init(enabled=False)
    assert isinstance(noop, NoOpHandle) and not noop.is_active()
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    wrapped = noop.wrap_optimizer(opt)
    loss = layer(torch.randn(2, 4)).sum()
    with wrapped.scale_loss(loss) as scaled:
        assert scaled is loss
    with noop.scale_loss(loss, opt) as scaled:
        assert scaled is loss
    assert layer(torch.randn(2, 4)).dtype is torch.float32


def test_the_handle_of_an_o1_initialize_deactivates_the_patches_only(amp):
    """apex's test_cache pattern: amp.initialize(O1) ... amp._amp_state.handle._deactivate()."""
    original = F.linear
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    amp._amp_state.handle._deactivate()
    assert F.linear is original and model(torch.randn(2, 4)).dtype is torch.float32
    with amp.scale_loss(model(torch.randn(2, 4)).sum(), opt) as scaled:  # still registered
        scaled.backward()
    opt.step()
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)  # and O1 can come back
    assert F.linear is not original
