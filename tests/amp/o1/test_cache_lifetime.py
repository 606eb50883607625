"""Issue 18, item 5: the cast cache never extends a tensor's life (cache.py's NOTE [cast cache lifetime]).

Only the weights of registered models and optimizers are held between calls, at most one cast per
weight and dtype; every other tensor (fresh leaves that require grad, weights of models that were
never passed to initialize) is referred to weakly and its entry vanishes with it. Lifetimes are
checked with weak references and entry counts, never with timings.
"""
import gc
import weakref

import pytest
import torch

from apexlite import amp
from apexlite.amp.handle import init as amp_init
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

DTYPE = torch.bfloat16
GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad}


@pytest.fixture
def o1_session():
    registered = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(registered.parameters(), lr=0.1)
    amp.initialize(registered, opt, opt_level="O1", dtype=DTYPE, verbosity=0)
    yield registered
    amp.deinitialize()


def _alive(refs):
    gc.collect()
    return sum(ref() is not None for ref in refs)


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_fresh_input_leaves_through_an_unregistered_model_are_not_kept_alive(o1_session, grad_mode):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))  # not registered
    refs = []
    with GRAD_MODES[grad_mode]():
        for _ in range(50):
            x = torch.randn(32, 64, requires_grad=True)  # a leaf that requires grad: cacheable
            refs.append(weakref.ref(x))
            loss = model(x).float().sum()
            if grad_mode == "grad":
                loss.backward()
            del x, loss
    assert _alive(refs) == 0
    assert len(current_session().cache) == 0


@pytest.mark.parametrize("grad_mode", list(GRAD_MODES))
def test_weights_of_a_deleted_unregistered_model_are_not_kept_alive(o1_session, grad_mode):
    refs = []
    with GRAD_MODES[grad_mode]():
        for _ in range(10):
            model = torch.nn.Linear(16, 16)
            refs += [weakref.ref(p) for p in model.parameters()]
            out = model(torch.randn(2, 16))
            out2 = torch.nn.functional.linear(out.float(), model.weight)  # a second use, outside any forward
            del model, out, out2
    assert _alive(refs) == 0
    assert len(current_session().cache) == 0


def test_an_unregistered_weight_is_served_from_the_cache_only_while_its_graph_holds_the_cast(o1_session):
    """Weak entries still serve the cast that the autograd graph keeps (no second cast in one graph)."""
    weight = torch.nn.Parameter(torch.randn(4, 4))
    cache = current_session().cache
    hidden = torch.randn(3, 4, requires_grad=True) * 1.0  # not a leaf: only the weight is cacheable
    cache.reset_counters()
    first = torch.nn.functional.linear(hidden, weight)  # mm saves the weight's cast for hidden's grad
    second = torch.nn.functional.linear(first.float(), weight)
    assert (cache.casts, cache.hits) == (1, 1)
    second.float().sum().backward()
    expected = torch.nn.functional.linear(torch.nn.functional.linear(hidden.to(DTYPE), weight.to(DTYPE)).float().to(DTYPE),
                                          weight.to(DTYPE))
    assert torch.equal(second.detach(), expected.detach())
    del first, second
    assert len(cache) == 0  # the graph is gone, and with it the only holder of the cast


def test_registered_weights_stay_within_the_stated_bound(o1_session):
    """Any number of uses of registered weights, in or out of forwards, without an iteration boundary:
    at most one cast per weight and dtype is held (grad on: outside a forward, no_grad casts are not cached)."""
    registered = o1_session
    cache = current_session().cache
    x = torch.randn(2, 4)
    with torch.enable_grad():
        for _ in range(20):
            registered(x)
            torch.nn.functional.linear(x, registered.weight, registered.bias)
            torch.mm(x, registered.weight)
    entries = cache.entries()
    assert len(cache) == len(entries) == 2
    assert {id(entry[0]) for entry in entries} == {id(registered.weight), id(registered.bias)}
    held = sum(entry[-1].numel() for entry in entries)
    assert held == sum(p.numel() for p in registered.parameters())


def test_the_cache_holds_nothing_after_deinitialize():
    model = torch.nn.Linear(4, 4)
    amp.initialize(model, opt_level="O1", dtype=DTYPE, verbosity=0)
    cache = current_session().cache
    torch.nn.functional.linear(torch.randn(2, 4), model.weight)
    assert len(cache) == 1
    amp.deinitialize()
    assert len(cache) == 0


def test_registered_weights_are_the_parameters_of_registered_models_and_optimizers():
    model, other, unregistered = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    amp.initialize(model, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        cache = current_session().cache
        assert all(cache.owns(p) for p in model.parameters())
        assert not any(cache.owns(p) for p in [*other.parameters(), *unregistered.parameters()])
        amp.initialize([], opt, opt_level="O1", dtype=DTYPE, verbosity=0)  # an optimizer joins the session
        assert all(cache.owns(p) for p in [*model.parameters(), *other.parameters()])
        assert not any(cache.owns(p) for p in unregistered.parameters())
    finally:
        amp.deinitialize()
    assert not any(cache.owns(p) for p in [*model.parameters(), *other.parameters()])


def test_an_optimizer_registered_by_the_handle_api_owns_its_weights():
    handle = amp_init(enabled=True)
    try:
        layer = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        cache = current_session().cache
        assert not cache.owns(layer.weight)
        with handle.scale_loss(layer(torch.randn(2, 4)).float().sum(), opt) as scaled:
            scaled.backward()
        assert cache.owns(layer.weight) and cache.owns(layer.bias)
    finally:
        handle._deactivate()
