"""Issue 18, items 6 and 8 (the cache's part): what runs under plain torch runs under O1, and both cast
paths cache exactly the same tensors (cache.py's NOTE [what the cache takes]).

Weights created under inference_mode, torch.func transforms (grad, jacrev, vmap), sparse Parameters,
Parameter subclasses, dispatch modes and fake tensors: each result is compared bit for bit with
torch.autocast's (CPU, bf16), and each case's cache counters with the rule both paths follow.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from apexlite import amp
from apexlite.amp.session import current_session

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

DTYPE = torch.bfloat16


class Tagged(torch.nn.Parameter):
    """A Parameter subclass of the kind libraries use to tag weights; it changes no arithmetic."""


class CountingMode(TorchDispatchMode):
    """A dispatch mode that only counts the ops it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def under_autocast(fn):
    with torch.autocast("cpu", dtype=DTYPE):
        return fn()


def under_o1(fn, *models):
    amp.initialize(list(models) or torch.nn.Linear(1, 1), opt_level="O1", dtype=DTYPE, verbosity=0)
    try:
        cache = current_session().cache
        cache.reset_counters()
        result = fn()
        return result, (cache.casts, cache.hits)
    finally:
        amp.deinitialize()


def assert_same(got, expected):
    if isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            assert_same(got[key], expected[key])
        return
    assert got.dtype is expected.dtype and torch.equal(got.to_dense() if got.is_sparse else got,
                                                     expected.to_dense() if expected.is_sparse else expected)


@pytest.mark.parametrize("registered", [False, True], ids=["unregistered", "registered"])
def test_weights_created_under_inference_mode_run_under_no_grad(registered):
    torch.manual_seed(0)
    with torch.inference_mode():
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)

    def run():
        with torch.no_grad():
            return model(x), torch.nn.functional.linear(x, model[0].weight)

    expected = under_autocast(run)
    got, counters = under_o1(run, *([model] if registered else []))
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert counters == (0, 0)  # inference tensors have no version counter to validate an entry with


def _linear_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


FUNCTORCH = {
    "grad wrt params": lambda model, x: torch.func.grad(
        lambda params: torch.func.functional_call(model, params, (x,)).float().sum())(dict(model.named_parameters())),
    "grad wrt input": lambda model, x: torch.func.grad(lambda inp: model(inp).float().sum())(x),
    "jacrev wrt input": lambda model, x: torch.func.jacrev(lambda inp: model(inp).float())(x),
    "vjp": lambda model, x: torch.func.vjp(lambda inp: model(inp).float(), x)[1](torch.ones(3, 4))[0],
}


@pytest.mark.parametrize("transform", list(FUNCTORCH))
def test_torch_func_transforms_through_an_o1_model_equal_autocast(transform):
    model = _linear_model()
    x = torch.randn(3, 8)
    fn = FUNCTORCH[transform]
    expected = under_autocast(lambda: fn(model, x))
    got, _ = under_o1(lambda: fn(model, x), model)
    assert_same(got, expected)


def _by_hand(model, x):
    """The O1 semantics of _linear_model written out: every Linear's inputs cast to DTYPE."""
    first, last = model[0], model[2]
    hidden = torch.nn.functional.linear(x.to(DTYPE), first.weight.to(DTYPE), first.bias.to(DTYPE))
    return torch.nn.functional.linear(torch.relu(hidden), last.weight.to(DTYPE), last.bias.to(DTYPE))


def test_vmap_through_an_o1_model_equals_vmap_of_the_casts_written_out():
    """torch.autocast does not cast inside vmap (its output stays fp32); O1 casts there as outside, so
    the reference is vmap over the same casts written out by hand, in plain torch."""
    model = _linear_model()
    x = torch.randn(3, 8)
    expected = torch.func.vmap(lambda sample: _by_hand(model, sample))(x)
    got, _ = under_o1(lambda: torch.func.vmap(model)(x), model)
    assert_same(got, expected)


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen"])
def test_sparse_parameters_run_as_under_autocast(frozen):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(4, 4).relu().to_sparse(), requires_grad=not frozen)
    source = torch.randn(4, 3, requires_grad=True)

    def run():
        out = torch.mm(weight, source * 1.0)  # a non-leaf operand: only the weight is a cache candidate
        if not frozen:  # torch cannot backpropagate through a sparse tensor's dtype conversion
            return out.detach(), out.detach()
        out.float().sum().backward()
        grad = source.grad.clone()
        source.grad = None
        return out.detach(), grad

    expected = under_autocast(run)
    got, counters = under_o1(run)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert counters == (0, 0)  # sparse tensors are converted each time, never cached


def test_parameter_subclasses_are_converted_each_time_on_both_paths():
    torch.manual_seed(0)
    weight = Tagged(torch.randn(4, 8))
    x = torch.randn(3, 8)

    def run():  # grad on: outside a registered forward no_grad casts are never cached (NOTE [cast cache lifetime])
        return (torch.nn.functional.linear(x, weight).detach(), torch.nn.functional.linear(x, weight).detach())

    expected = under_autocast(run)
    got, counters = under_o1(run)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert counters == (0, 0)


def test_plain_parameters_are_cached_on_both_paths():
    """The control for the cases above: the same calls with a registered plain Parameter hit the cache."""
    model = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8)

    def run():  # grad on, as in the case above
        return (torch.nn.functional.linear(x, model.weight).detach(),
                torch.nn.functional.linear(x, model.weight).detach())

    expected = under_autocast(run)
    got, counters = under_o1(run, model)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert counters == (1, 1)


@pytest.mark.parametrize("grad_mode", ["no_grad", "grad"])
def test_nothing_is_cached_while_a_dispatch_mode_is_active(grad_mode):
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    context = torch.no_grad if grad_mode == "no_grad" else torch.enable_grad

    def run():
        with context(), CountingMode() as mode:
            first, second = model(x), torch.nn.functional.linear(x, model.weight, model.bias)
        assert mode.ops > 0
        return first.detach(), second.detach()

    expected = under_autocast(run)
    got, counters = under_o1(run, model)
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert counters == (0, 0)


def test_fake_tensors_are_never_cached():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run():
        with FakeTensorMode():
            model = torch.nn.Linear(8, 4)
            out = model(torch.randn(3, 8))
            return out.dtype, tuple(out.shape), len(current_session().cache)

    got, counters = under_o1(run)
    assert got == (DTYPE, (3, 4), 0)
    assert counters == (0, 0)
