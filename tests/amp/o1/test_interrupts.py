"""Issue 18, item 2: any BaseException (Ctrl-C, sys.exit, a closed generator) passing through a forward,
scale_loss, a casts-off block or a wrapped op leaves O1's forward scope, cast switches and cache
consistent.

The reference for every value is the same ops applied by hand to the weights' current values (exact
in bf16: one rounding either way). A forward scope left open by an interrupt used to keep every later
forward from dropping the cache, so an EMA swap through `p.data.copy_` was served stale casts.
"""
import copy

import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

DTYPE = torch.bfloat16


class Interrupted(BaseException):
    """A BaseException that is none of Python's own (e.g. a framework's cancellation signal)."""


INTERRUPTS = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit, "GeneratorExit": GeneratorExit,
              "BaseException subclass": Interrupted, "Exception": RuntimeError}


class Net(torch.nn.Module):
    """Linear -> ReLU -> Linear that can be told to raise between its layers (a Ctrl-C mid-forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 4)
        self.interrupt = None

    def forward(self, x):
        hidden = torch.relu(self.first(x))
        if self.interrupt is not None:
            raise self.interrupt()
        return self.second(hidden)


class Outer(torch.nn.Module):
    """A registered model whose forward calls another registered model and survives its interrupt."""

    def __init__(self, inner: Net) -> None:
        super().__init__()
        self.inner = inner
        self.head = torch.nn.Linear(8, 8)

    def forward(self, x):
        try:
            self.inner(x)
        except BaseException:
            pass
        return self.inner.first(self.head(x))


def expected(net, x):
    def linear(layer, value):
        return torch.nn.functional.linear(value, layer.weight.detach().to(DTYPE), layer.bias.detach().to(DTYPE))

    return linear(net.second, torch.relu(linear(net.first, x.to(DTYPE))))


def swap_copy(model, source):
    with torch.no_grad():
        for p, q in zip(model.parameters(), source.parameters()):
            p.data.copy_(q.data)


def shadow_of(net):
    shadow = copy.deepcopy(net)
    with torch.no_grad():
        for p in shadow.parameters():
            p.mul_(-3.0).add_(1.5)
    return shadow


@pytest.fixture
def o1_net():
    torch.manual_seed(0)
    net = Net()
    shadow = shadow_of(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = amp.initialize(net, opt, opt_level="O1", dtype=DTYPE, verbosity=0)
    yield net, shadow, opt
    amp.deinitialize()


@pytest.mark.parametrize("interrupt", INTERRUPTS.values(), ids=list(INTERRUPTS))
@pytest.mark.parametrize("grad_mode", ["no_grad", "grad"])
def test_an_interrupted_forward_does_not_keep_later_forwards_from_dropping_the_cache(o1_net, interrupt, grad_mode):
    net, shadow, _ = o1_net
    x = torch.randn(5, 8)
    context = torch.no_grad if grad_mode == "no_grad" else torch.enable_grad
    with context():
        net.interrupt = interrupt
        with pytest.raises(interrupt):
            net(x)
        net.interrupt = None
        trained = net(x)  # fills the cache with the trained weights' casts
        backup = copy.deepcopy(net)
        swap_copy(net, shadow)  # EMA evaluation: swap the averaged weights in...
        ema = net(x)
        swap_copy(net, backup)  # ...and back
        again = net(x)
    assert torch.equal(ema.detach(), expected(shadow, x))
    assert torch.equal(again.detach(), expected(backup, x)) and torch.equal(again.detach(), trained.detach())
    assert len(current_session().cache) == 0  # the last forward's end dropped every cast


@pytest.mark.parametrize("interrupt", INTERRUPTS.values(), ids=list(INTERRUPTS))
def test_an_interrupted_inner_forward_does_not_keep_the_outer_one_from_dropping_the_cache(interrupt):
    torch.manual_seed(0)
    inner = Net()
    outer = Outer(inner)
    shadow = shadow_of(inner)
    amp.initialize([outer, inner], opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        x = torch.randn(5, 8)
        inner.interrupt = interrupt
        with torch.no_grad():
            outer(x)  # the inner forward raises inside the outer one, which goes on
            assert len(current_session().cache) == 0
            inner.interrupt = None
            swap_copy(inner, shadow)
            out = inner(x)
        assert torch.equal(out, expected(shadow, x))
    finally:
        amp.deinitialize()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, GeneratorExit], ids=lambda e: e.__name__)
def test_an_interrupt_inside_disable_casts_restores_the_casts(o1_net, interrupt):
    net, _, _ = o1_net
    x = torch.randn(2, 8)
    with pytest.raises(interrupt):
        with amp.disable_casts():
            assert net(x).dtype is torch.float32
            raise interrupt()
    assert net(x).dtype is DTYPE
    assert current_session().cast_state.enabled


def test_a_generator_closed_inside_disable_casts_restores_the_casts(o1_net):
    net, _, _ = o1_net
    x = torch.randn(2, 8)

    def protected():
        with amp.disable_casts():
            yield net(x).dtype
            yield net(x).dtype

    generator = protected()
    assert next(generator) is torch.float32
    generator.close()  # GeneratorExit at the yield, on this thread
    assert net(x).dtype is DTYPE


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, Interrupted], ids=lambda e: e.__name__)
def test_an_interrupt_inside_scale_loss_leaves_scaler_cache_and_next_step_as_without_it(interrupt):
    """Ctrl-C after backward inside scale_loss: the grads are settled, the scale is untouched, the cache
    is dropped, and the next iteration gives exactly what it gives without the interrupted one."""
    def run(interrupted):
        torch.manual_seed(0)
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        net, opt = amp.initialize(net, opt, opt_level="O1", dtype=torch.float16, loss_scale="dynamic", verbosity=0)
        try:
            x = torch.randn(5, 8)
            if interrupted:
                with pytest.raises(interrupt):
                    with amp.scale_loss(net(x).float().pow(2).mean(), opt) as scaled:
                        scaled.backward()
                        raise interrupt()
                assert len(current_session().cache) == 0
                opt.zero_grad()
            scale = current_session().loss_scalers[0].loss_scale()
            with amp.scale_loss(net(x).float().pow(2).mean(), opt) as scaled:
                scaled.backward()
            opt.step()
            return scale, [p.detach().clone() for p in net.parameters()]
        finally:
            amp.deinitialize()

    clean_scale, clean_params = run(False)
    scale, params = run(True)
    assert scale == clean_scale
    assert all(torch.equal(a, b) for a, b in zip(params, clean_params))


def test_an_interrupt_during_a_weight_cast_leaves_no_entry_and_casts_afresh_next_time(o1_net):
    """A KeyboardInterrupt raised while a wrapped op casts a weight (here by the cast kernel itself)."""
    net, _, _ = o1_net
    x = torch.randn(3, 8)
    weight = net.first.weight
    fired = []

    def interrupting_to_copy(tensor, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                             memory_format=None):
        if isinstance(tensor, torch.Tensor) and tensor.data_ptr() == weight.data_ptr() and not fired:
            fired.append(True)
            raise KeyboardInterrupt
        out = torch.empty_strided(tensor.size(), tensor.stride(), dtype=dtype if dtype is not None else tensor.dtype)
        return out.copy_(tensor)

    library = torch.library.Library("aten", "IMPL")
    library.impl("_to_copy", interrupting_to_copy, "CPU")
    try:
        with pytest.raises(KeyboardInterrupt):
            torch.nn.functional.linear(x, weight)
    finally:
        library._destroy()
    assert fired and weight not in current_session().cache
    assert current_session().cast_state.enabled
    out = torch.nn.functional.linear(x, weight)
    assert torch.equal(out.detach(), torch.nn.functional.linear(x.to(DTYPE), weight.detach().to(DTYPE)))


def test_an_interrupted_forward_holds_its_inputs_no_longer_than_until_the_next_forward(o1_net):
    import gc
    import weakref

    net, _, _ = o1_net
    x = torch.randn(5, 8)
    ref = weakref.ref(x)
    net.interrupt = KeyboardInterrupt
    try:
        net(x)
    except KeyboardInterrupt:
        pass
    del x
    net.interrupt = None
    net(torch.randn(5, 8))  # finds the interrupted forward's scope over and lets go of its frame
    gc.collect()
    assert ref() is None
