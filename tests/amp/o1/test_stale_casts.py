"""Probe: weights written through `.data` must never be served from a stale cast (issue: EMA/SWA swaps).

`p.data.copy_(w)` and `p.data = w` change no autograd version counter, so a cache keyed only on it
served the old fp16 copy on the next forward. Every case compares the O1 output with the same ops
applied by hand to the weights' *current* values (exact for bf16: one rounding either way).
"""
import contextlib
import copy
import gc

import pytest
import torch

from apexlite import amp
from apexlite.amp.session import current_session

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


ENTRY_POINTS = {"submodule": lambda model, x: model[0](x), "functional": lambda model, x: torch.nn.functional.linear(
    x, model[0].weight, model[0].bias)}


@pytest.mark.parametrize("call", ENTRY_POINTS.values(), ids=list(ENTRY_POINTS))
def test_evaluation_outside_the_models_forward_sees_a_data_copy_swap(o1_pair, call):
    """`model.encode(x)` / `model.enc(x)` evaluated with raw then EMA weights swapped in by `p.data.copy_`:
    outside a registered forward, no_grad casts are not cached, so the second call sees the EMA weights."""
    model, shadow, _ = o1_pair
    x = torch.randn(5, 8)
    with torch.no_grad():
        raw = call(model, x)
        swap_copy(model, shadow)
        swapped = call(model, x)
    expected = torch.nn.functional.linear(x.to(DTYPE), shadow[0].weight.to(DTYPE), shadow[0].bias.to(DTYPE))
    assert not torch.equal(raw, expected) and torch.equal(swapped, expected)


def test_a_registered_forward_under_no_grad_still_casts_a_reused_weight_once(cast_path):
    """Inside the forward scope the cache serves no_grad casts (a weight used twice is cast once)."""
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.layer(self.layer(x))

    model = Twice()
    amp.initialize(model, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        cache = current_session().cache
        cache.reset_counters()
        with torch.no_grad():
            model(torch.randn(2, 8))
        inside = (cache.casts, cache.hits)
        cache.reset_counters()
        with torch.no_grad():
            model.layer(model.layer(torch.randn(2, 8)))  # the same calls outside the forward
        outside = (cache.casts, cache.hits)
    finally:
        amp.deinitialize()
    assert inside == (2, 2) and outside == (0, 0)  # weight and bias cast once, then served; outside: not cached


# --- issue 18, item 3: an entry is valid only for the exact tensor it was cast from -----------------------

def _fresh(weight, x):
    """F.linear(x, weight) as O1 must compute it from the weight's current values."""
    return torch.nn.functional.linear(x.to(DTYPE), weight.detach().to(DTYPE))


def _rebind_transpose(weight):
    weight.data = weight.data.t()  # same storage, offset and version; strides swap


def _rebind_view(weight):
    weight.data = weight.data.view(4, 16)  # same storage, new shape (plain torch takes 16 input features now)


REBINDINGS = {"transpose": _rebind_transpose, "view": _rebind_view}


@pytest.mark.parametrize("rebind", REBINDINGS.values(), ids=list(REBINDINGS))
def test_data_rebound_to_a_view_of_the_same_storage_is_cast_afresh(rebind):
    """`w.data = w.data.t()` / `.reshape(...)` keep the data pointer and the version counter."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8, bias=False)  # square: the transpose keeps the shape, only values move
    amp.initialize(layer, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        weight = layer.weight
        x = torch.randn(3, 8)
        # functional calls outside the model's forward: the cache keeps the first cast between them
        assert torch.nn.functional.linear(x, weight).dtype is DTYPE
        rebind(weight)
        x = torch.randn(3, weight.shape[1])
        assert torch.equal(torch.nn.functional.linear(x, weight).detach(), _fresh(weight, x))
    finally:
        amp.deinitialize()


def test_data_rebound_to_another_offset_of_one_storage_is_cast_afresh(o1_pair):
    model, _, _ = o1_pair
    weight = model[0].weight
    base = torch.randn(2, *weight.shape)
    weight.data = base[0]
    x = torch.randn(3, weight.shape[1])
    torch.nn.functional.linear(x, weight)
    weight.data = base[1]  # same storage, shape and strides; offset differs
    assert torch.equal(torch.nn.functional.linear(x, weight).detach(), _fresh(weight, x))


def test_data_rebound_to_another_storage_at_the_same_address_is_cast_afresh(o1_pair):
    """Two storages over one buffer: same data pointer, shape, strides and version, other storage."""
    model, _, _ = o1_pair
    weight = model[0].weight
    buffer = bytearray(weight.numel() * 4)
    first = torch.frombuffer(buffer, dtype=torch.float32).view(weight.shape)
    first.copy_(weight.data)
    weight.data = first
    x = torch.randn(3, weight.shape[1])
    torch.nn.functional.linear(x, weight)
    second = torch.frombuffer(buffer, dtype=torch.float32).view(weight.shape)
    second.mul_(-2.0)  # written through the other storage: `weight`'s version does not move
    weight.data = second
    assert weight.data_ptr() == first.data_ptr()
    assert torch.equal(torch.nn.functional.linear(x, weight).detach(), _fresh(weight, x))


def test_an_entry_outlives_the_storage_it_was_stamped_from(o1_pair):
    """An entry is served while its weight keeps its storage; `p.data = w` then frees that storage while the
    cache still holds the entry stamped from it: the entry misses, and dropping it is harmless. (torch 2.1
    makes a new storage object per `untyped_storage()` call and frees it without clearing Python weak
    references to it: a cache stamping storages that way never hit, and crashed the interpreter when cleared.)"""
    model, _, _ = o1_pair
    weight = model[0].weight
    x = torch.randn(3, weight.shape[1])
    cache = current_session().cache
    torch.nn.functional.linear(x, weight)
    cache.reset_counters()
    torch.nn.functional.linear(x, weight)
    assert (cache.casts, cache.hits) == (0, 1)
    weight.data = torch.randn_like(weight)  # the old storage's last reference goes
    gc.collect()
    cache.reset_counters()
    out = torch.nn.functional.linear(x, weight)
    assert (cache.casts, cache.hits) == (1, 0)
    cache.clear()
    gc.collect()
    assert torch.equal(out.detach(), _fresh(weight, x))


@contextlib.contextmanager
def updated_during_its_cast(weight):
    """Inside the block the CPU cast kernel is overridden: the first time it casts `weight`, the weight is
    updated in place (as another thread's optimizer or averaging step would) after its values were read."""
    if not hasattr(torch.autograd.graph, "increment_version"):
        pytest.skip("needs torch.autograd.graph.increment_version")
    pending = [weight]

    def racing_to_copy(tensor, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                       memory_format=None):
        if not isinstance(tensor, torch.Tensor):  # a wrapped Python number
            return torch.scalar_tensor(tensor, dtype=dtype)
        out = torch.empty_strided(tensor.size(), tensor.stride(), dtype=dtype if dtype is not None else tensor.dtype)
        out.copy_(tensor)
        if pending and tensor.data_ptr() == pending[0].data_ptr():
            pending.clear()
            tensor.add_(torch.ones_like(tensor))  # below autograd: the version is bumped by hand
            torch.autograd.graph.increment_version(tensor)
        return out

    library = torch.library.Library("aten", "IMPL")
    library.impl("_to_copy", racing_to_copy, "CPU")
    try:
        yield
    finally:
        library._destroy()
    assert not pending, "the weight was never cast inside the block"


@pytest.mark.parametrize("grad_mode", ["no_grad", "grad"])
def test_an_update_during_the_cast_makes_the_entry_miss(o1_pair, grad_mode):
    model, _, _ = o1_pair
    weight = model[0].weight
    x = torch.randn(3, weight.shape[1])
    context = torch.no_grad if grad_mode == "no_grad" else torch.enable_grad
    with context():
        version = weight._version
        with updated_during_its_cast(weight):
            torch.nn.functional.linear(x, weight)  # cast from the old values; the weight changes meanwhile
        assert weight._version == version + 1
        after = torch.nn.functional.linear(x, weight)
    assert torch.equal(after.detach(), _fresh(weight, x))


def test_concurrent_in_place_updates_never_leave_a_stale_entry_valid(cast_path):
    """A Hogwild-style writer thread updates a weight in place while the main thread casts it. Once the
    writer is done, the cache must serve the weight's final values in every trial."""
    import threading

    model = torch.nn.Linear(512, 512, bias=False)  # large enough that casts and updates overlap
    amp.initialize(model, opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        cache = current_session().cache
        weight = model.weight
        stale = 0
        for trial in range(12):
            done = threading.Event()

            def writer():
                with torch.no_grad():
                    for step in range(20):
                        weight.mul_(-1.0).add_(0.5)
                done.set()

            thread = threading.Thread(target=writer)
            thread.start()
            with torch.no_grad():
                while not done.is_set():
                    cache.cast(weight, DTYPE)
            thread.join()
            with torch.no_grad():
                served = cache.cast(weight, DTYPE)
            stale += not torch.equal(served, weight.detach().to(DTYPE))
        assert stale == 0
    finally:
        amp.deinitialize()
