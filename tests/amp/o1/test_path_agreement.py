"""Issue 18 item 8 (the wrapper part): one behaviour, two cast paths.

- A Tensor subclass is converted as torch.autocast converts it: through the dtype conversion torch
  dispatches (Tensor.to semantics, which honours __torch_function__), never through a Python override
  of its `.half()`/`.bfloat16()`/`.float()` methods.
- Containers: one that holds nothing to cast is passed on as the very same object; one that holds a cast
  tensor is rebuilt with its own type, through its constructor (a defaultdict keeps its factory).
- A hypothesis property test draws op sequences, argument structures and subclasses, runs each program
  on the native and on the Python path, and requires the same types, dtypes, bits and gradients.
"""
from __future__ import annotations

import collections
import contextlib
import sys
from typing import Any, Iterator, List

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from apexlite import amp
from apexlite.amp.o1 import native_casts

LOW_DTYPES = [torch.float16, torch.bfloat16]
PATHS = ["native", "python"]
needs_native = pytest.mark.skipif(not native_casts.use_native(), reason="needs the native O1 cast path")


def echo_low(*args: Any, **kwargs: Any) -> Any:
    """Registered per session as a half function: returns what O1 passed in."""
    return args, kwargs


def echo_float(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


def echo_promote(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


class OwnConversions(torch.Tensor):
    """A subclass whose conversion methods give zeros (and count calls): O1 must never use them."""

    calls = 0

    def _zeros(self, dtype: torch.dtype) -> torch.Tensor:
        type(self).calls += 1
        return torch.zeros(self.shape, dtype=dtype).as_subclass(OwnConversions)

    def half(self, *args, **kwargs):
        return self._zeros(torch.float16)

    def bfloat16(self, *args, **kwargs):
        return self._zeros(torch.bfloat16)

    def float(self, *args, **kwargs):
        return self._zeros(torch.float32)


class Tagged(torch.Tensor):
    """A subclass with torch's default __torch_function__: results keep the subclass."""


class ListSub(list):
    pass


class TupleSub(tuple):
    pass


class DictSub(dict):
    pass


Pair = collections.namedtuple("Pair", "first second")


@contextlib.contextmanager
def session(path: str, low: torch.dtype, *models: torch.nn.Module) -> Iterator[None]:
    """An O1 session on the given cast path, with the echo functions registered under their policies."""
    chosen = native_casts.use_native
    native_casts.use_native = lambda: path == "native"
    module = sys.modules[__name__]
    try:
        amp.register_half_function(module, "echo_low")
        amp.register_float_function(module, "echo_float")
        amp.register_promote_function(module, "echo_promote")
        amp.initialize(list(models) or torch.nn.Linear(1, 1), opt_level="O1", dtype=low, verbosity=0)
        try:
            yield
        finally:
            amp.deinitialize()
    finally:
        native_casts.use_native = chosen


def describe(value: Any) -> Any:
    """A comparable picture of a result: container types, and each tensor's type, dtype and bits."""
    if isinstance(value, torch.Tensor):
        plain = value.detach().as_subclass(torch.Tensor).contiguous()
        if plain.is_floating_point():  # compare bits: NaNs and signed zeros included
            plain = plain.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[plain.element_size()])
        return type(value).__name__, value.dtype, tuple(plain.shape), plain.view(-1).tolist()
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [describe(item) for item in value]
    if isinstance(value, dict):
        extra = getattr(value, "default_factory", None)
        return type(value).__name__, extra, [(key, describe(item)) for key, item in value.items()]
    return value


# --- subclass conversions ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("low", LOW_DTYPES, ids=str)
def test_a_subclass_overriding_its_conversions_is_cast_as_autocast_casts_it(path, low):
    if path == "native" and not native_casts.use_native():
        pytest.skip("needs the native O1 cast path")
    torch.manual_seed(0)
    a = torch.randn(3, 4).as_subclass(OwnConversions)
    b = torch.randn(4, 2)
    with torch.autocast("cpu", dtype=low):
        expected = torch.mm(a, b)
    OwnConversions.calls = 0
    with session(path, low):
        got = torch.mm(a, b)
        low_input = torch.rand(5).to(low).as_subclass(OwnConversions)
        exp = torch.exp(low_input)
    assert OwnConversions.calls == 0
    assert describe(got) == describe(expected)
    assert describe(exp) == describe(torch.exp(torch.Tensor.float(low_input)))


@pytest.mark.parametrize("path", PATHS)
def test_a_subclass_with_torch_function_keeps_its_type_through_the_cast(path):
    if path == "native" and not native_casts.use_native():
        pytest.skip("needs the native O1 cast path")
    a, b = torch.randn(3, 4).as_subclass(Tagged), torch.randn(4, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.mm(a, b)
    with session(path, torch.bfloat16):
        got = torch.mm(a, b)
    assert type(got) is Tagged
    assert describe(got) == describe(expected)


# --- containers -------------------------------------------------------------------------------------------

def _containers(tensor: torch.Tensor) -> dict:
    defaults = collections.defaultdict(list, {"t": tensor})
    return {
        "list": [tensor, 1], "tuple": (tensor, 1), "list subclass": ListSub([tensor, 1]),
        "tuple subclass": TupleSub((tensor, 1)),
        "namedtuple": Pair(tensor, 1), "dict": {"t": tensor, "n": 1}, "defaultdict": defaults,
        "OrderedDict": collections.OrderedDict([("t", tensor), ("n", 1)]), "dict subclass": DictSub(t=tensor, n=1),
        "torch.Size": torch.Size([2, 3]),
    }


CONTAINER_KINDS = list(_containers(torch.zeros(1)))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", CONTAINER_KINDS)
def test_containers_keep_their_type_and_pass_unchanged_when_nothing_is_cast(path, kind):
    if path == "native" and not native_casts.use_native():
        pytest.skip("needs the native O1 cast path")
    fp32, half = torch.randn(2, 2), torch.randn(2, 2).half()
    with session(path, torch.float16):
        untouched = _containers(half)[kind]
        (passed,), _ = echo_low(untouched)
        assert passed is untouched
        original = _containers(fp32)[kind]
        (rebuilt,), kwargs = echo_low(original, keyword=original)
    assert type(rebuilt) is type(original) and type(kwargs["keyword"]) is type(original)
    assert describe(rebuilt) == describe(_containers(fp32.half())[kind])
    if kind == "defaultdict":
        assert rebuilt.default_factory is list and rebuilt["missing"] == []
    if kind in ("list", "list subclass", "dict", "defaultdict"):
        assert next(iter(original.values())) is fp32 if isinstance(original, dict) else original[0] is fp32


@needs_native
@pytest.mark.parametrize("kind", CONTAINER_KINDS)
@pytest.mark.parametrize("function", ["echo_low", "echo_float", "echo_promote"])
def test_both_paths_rebuild_containers_identically(function, kind):
    results = []
    for path in PATHS:
        torch.manual_seed(0)
        mixed = [torch.randn(2, 2), torch.randn(2, 2).half(), torch.randn(2, 2).bfloat16()]
        with session(path, torch.bfloat16):
            call = getattr(sys.modules[__name__], function)
            results.append(describe(call(*[_containers(t)[kind] for t in mixed], key=_containers(mixed[1])[kind])))
    assert results[0] == results[1]


# --- the property test ------------------------------------------------------------------------------------

SUBCLASSES = {"plain": lambda t: t, "tagged": lambda t: t.as_subclass(Tagged),
              "own conversions": lambda t: t.as_subclass(OwnConversions)}
SEQUENCES = {"list": list, "tuple": tuple, "list subclass": ListSub, "tuple subclass": TupleSub}
MAPPINGS = {"dict": dict, "defaultdict": lambda items: collections.defaultdict(list, items),
            "dict subclass": DictSub, "OrderedDict": collections.OrderedDict}


def _step(state: dict, op: str, wrap: Any, seq: Any, mapping: Any, low: torch.dtype) -> Any:
    """One op of a drawn program; `state` holds the model's weight/bias, an input and the last result."""
    x, w, b, last = state["x"], state["w"], state["b"], state["last"]
    x_in, last_in = wrap(x), wrap(last)
    if op == "mm":
        return torch.mm(x_in, w.t())
    if op == "linear (keywords)":
        return F.linear(input=x_in, weight=w, bias=b)
    if op == "matmul method":
        return x_in.matmul(w.t())
    if op == "cat":
        return torch.cat(seq([x_in, last_in.to(low)]), dim=0)
    if op == "stack":
        return torch.stack(seq([last_in, x_in.to(low)]))
    if op == "addcmul (promote)":
        return torch.addcmul(x_in, last_in.to(low), x)
    if op == "exp":
        return torch.exp(last_in.to(low) / 8)
    if op == "softmax":
        return F.softmax(last_in.to(low), dim=-1)
    if op == "sum":
        return torch.sum(last_in.to(low), 0, keepdim=True).expand_as(last)
    if op == "mm out=":  # torch refuses out= where autograd would be needed
        out = torch.empty(x.shape[0], w.shape[0])
        with torch.no_grad():
            return torch.mm(x_in, w.t(), out=out) * 1
    if op in ("echo_low", "echo_float", "echo_promote"):
        args, kwargs = getattr(sys.modules[__name__], op)(seq([x_in, last_in.to(low)]), m=mapping({"w": w}))
        return args[0][0] + args[0][1].to(args[0][0].dtype) + kwargs["m"]["w"].to(args[0][0].dtype)[:1]
    raise AssertionError(op)


OPS = ["mm", "linear (keywords)", "matmul method", "cat", "stack", "addcmul (promote)", "exp", "softmax", "sum",
       "mm out=", "echo_low", "echo_float", "echo_promote"]


def run_program(path: str, low: torch.dtype, seed: int, steps: List[tuple]) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 4)
    x = torch.randn(4, 4, requires_grad=True)
    outputs, results = [], []
    with session(path, low, model):
        state = {"x": x, "w": model.weight, "b": model.bias, "last": torch.randn(4, 4)}
        for op, subclass, sequence, mapping in steps:
            result = _step(state, op, SUBCLASSES[subclass], SEQUENCES[sequence], MAPPINGS[mapping], low)
            outputs.append(describe(result))
            results.append(result.as_subclass(torch.Tensor))
            state["last"] = results[-1].reshape(-1)[:16].reshape(4, 4).float()
        sum((result.float().sum() for result in results), x.sum() * 0).backward()
    grads = [describe(t.grad) if t.grad is not None else None for t in (x, model.weight, model.bias)]
    return outputs, grads


program_steps = st.lists(
    st.tuples(st.sampled_from(OPS), st.sampled_from(list(SUBCLASSES)), st.sampled_from(list(SEQUENCES)),
              st.sampled_from(list(MAPPINGS))),
    min_size=1, max_size=6)


@needs_native
@settings(max_examples=30, deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])
@given(low=st.sampled_from(LOW_DTYPES), seed=st.integers(0, 2 ** 16), steps=program_steps)
def test_native_and_python_paths_agree_bit_for_bit(low, seed, steps):
    native = run_program("native", low, seed, steps)
    python = run_program("python", low, seed, steps)
    assert native == python
