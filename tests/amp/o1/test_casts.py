"""Every patched op, table-driven: output dtype and a bitwise match with the unpatched op on hand-cast inputs."""
import warnings

import pytest
import torch

from apexlite import amp
from apexlite.amp.o1.lists import op_entries
from apexlite.amp.o1.patcher import resolve
from apexlite.amp.o1.policies import CastPolicy, map_tensors
from apexlite.amp.session import current_session
from tests.amp.o1.cast_cases import CASES, SAMPLED_ELSEWHERE

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LOW_DTYPES = [torch.float16, torch.bfloat16]
ENTRIES = [e for e in op_entries() if e.namespace not in SAMPLED_ELSEWHERE]


def call(entry, args, kwargs):
    target = resolve(entry.namespace)
    if entry.namespace == "torch.Tensor":
        return getattr(args[0], entry.name)(*args[1:], **kwargs)
    return getattr(target, entry.name)(*args, **kwargs)


def to(dtype):
    return lambda t: t.to(dtype) if t.is_floating_point() else t


@pytest.fixture
def o1():
    def start(dtype, **kwargs):
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=dtype, verbosity=0, **kwargs)

    yield start
    amp.deinitialize()


def test_every_table_entry_has_a_sample_case():
    missing = [e.qualname for e in ENTRIES if e.qualname not in CASES]
    assert not missing


def _build(entry, dtype_for_inputs):
    args, kwargs = CASES[entry.qualname]()
    return map_tensors(args, to(dtype_for_inputs)), map_tensors(kwargs, to(dtype_for_inputs))


def assert_bitwise(result, expected):
    if isinstance(expected, torch.Tensor):
        assert result.dtype is expected.dtype
        torch.testing.assert_close(result, expected, rtol=0, atol=0, equal_nan=True)
    else:
        assert result == expected


def _run(entry, args, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(entry, args, kwargs)


@pytest.mark.parametrize("low", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.policy is CastPolicy.LOW_PRECISION], ids=lambda e: e.qualname)
def test_low_precision_ops_cast_fp32_inputs(entry, low, o1):
    args, kwargs = _build(entry, torch.float32)
    expected = _run(entry, *map_tensors((args, kwargs), to(low)))
    o1(low)
    assert_bitwise(_run(entry, args, kwargs), expected)


@pytest.mark.parametrize("low", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.policy is CastPolicy.FLOAT], ids=lambda e: e.qualname)
def test_float_ops_cast_low_precision_inputs(entry, low, o1):
    args, kwargs = _build(entry, low)
    expected = _run(entry, *map_tensors((args, kwargs), to(torch.float32)))
    o1(low)
    result = _run(entry, args, kwargs)
    assert_bitwise(result, expected)
    if isinstance(expected, torch.Tensor) and expected.is_floating_point():
        assert result.dtype is torch.float32


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.policy in (CastPolicy.PROMOTE, CastPolicy.SEQUENCE_PROMOTE)],
                         ids=lambda e: e.qualname)
def test_promote_ops_use_the_widest_input_dtype(entry, o1):
    args, kwargs = CASES[entry.qualname]()
    mixed = list(args)
    if entry.policy is CastPolicy.SEQUENCE_PROMOTE:
        mixed[0] = [mixed[0][0].half()] + list(mixed[0][1:])
    else:
        mixed[0] = mixed[0].half()
    # the widest of {fp16, fp32} is fp32: the expectation is the all-fp32 call on the same values
    expected = _run(entry, *map_tensors((tuple(mixed), kwargs), to(torch.float32)))
    o1(torch.float16)
    assert_bitwise(_run(entry, tuple(mixed), kwargs), expected)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.policy is CastPolicy.MATCH_SELF], ids=lambda e: e.qualname)
@pytest.mark.parametrize("self_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_inplace_matmul_family_casts_others_to_self_dtype(entry, self_dtype, o1):
    args, kwargs = CASES[entry.qualname]()
    target = args[0].to(self_dtype)
    expected = getattr(target.clone(), entry.name)(*[a.to(self_dtype) for a in args[1:]])
    o1(torch.float16)
    result = getattr(target, entry.name)(*args[1:])
    assert result is target
    assert_bitwise(result, expected)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.policy is CastPolicy.INPLACE_FLOAT], ids=lambda e: e.qualname)
def test_inplace_fp32_ops_refuse_low_precision_self(entry, o1):
    args, kwargs = CASES[entry.qualname]()
    o1(torch.float16)
    low_args = (args[0].half(),) + tuple(args[1:])
    with pytest.raises(NotImplementedError, match="in-place"):
        _run(entry, low_args, kwargs)
    expected = getattr(torch, entry.name[:-1])(*args)
    assert_bitwise(_run(entry, args, kwargs), expected)


def test_banned_binary_cross_entropy_points_to_bce_with_logits(o1):
    probs, target = torch.rand(3, 4) * 0.8 + 0.1, torch.rand(3, 4)
    o1(torch.float16)
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        torch.nn.BCELoss()(probs.half(), target)
    # fp32 inputs are fine, as in apex
    expected = torch.nn.functional.binary_cross_entropy(probs, target)
    assert expected.dtype is torch.float32


APEX_BANNED_TEXT = (  # apex's message as its documentation gives it (log parsers match it): apexlite's starts with it
    "\namp does not work out-of-the-box with `F.binary_cross_entropy` or `torch.nn.BCELoss.` It requires that the "
    "output of the previous function be already a FloatTensor. \n\nMost models have a Sigmoid right before BCELoss. "
    "In that case, you can use\n    torch.nn.BCEWithLogitsLoss\nto combine Sigmoid+BCELoss into a single layer that "
    "is compatible with amp.\nAnother option is to add\n    amp.register_float_function(torch, 'sigmoid')\nbefore "
    "calling `amp.init()`.\nIf you _really_ know what you are doing, you can disable this warning by passing "
    "allow_banned=True to `amp.init()`.")


def test_the_banned_message_starts_with_apex_text_verbatim(o1):
    o1(torch.bfloat16)
    with pytest.raises(NotImplementedError) as raised:
        torch.nn.functional.binary_cross_entropy(torch.rand(2).bfloat16(), torch.rand(2))
    assert str(raised.value).startswith(APEX_BANNED_TEXT)
    assert "With amp.initialize: call amp.register_float_function(torch, 'sigmoid') before it" in str(raised.value)


def test_casts_leave_float64_int_and_bool_alone(o1):
    o1(torch.float16)
    a64 = torch.randn(2, 3, dtype=torch.float64)
    assert torch.mm(a64, a64.t()).dtype is torch.float64
    ints = torch.arange(6).reshape(2, 3)
    assert torch.sum(ints).dtype is torch.int64
    assert torch.sum(torch.ones(3, dtype=torch.bool)).dtype is torch.int64


def test_nested_containers_are_cast(o1):
    weights = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(4, 2))]
    o1(torch.bfloat16)
    out = torch.linalg.multi_dot([torch.randn(2, 3)] + weights)
    assert out.dtype is torch.bfloat16


@pytest.mark.parametrize("spellings", [
    ("torch.mm", "Tensor.mm", "@"), ("torch.matmul", "Tensor.matmul", "@"),
])
def test_torch_tensor_and_operator_spellings_agree(spellings, o1):
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    o1(torch.bfloat16)
    name = spellings[0].split(".")[1]
    results = [getattr(torch, name)(a, b), getattr(a, name)(b), a @ b, getattr(torch.Tensor, name)(a, b)]
    for result in results:
        assert_bitwise(result, results[0])
    assert results[0].dtype is torch.bfloat16


def test_functional_and_module_spellings_agree(o1):
    linear = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    o1(torch.float16)
    assert_bitwise(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))
    assert linear(x).dtype is torch.float16
    assert torch.nn.functional.softmax(linear(x), -1).dtype is torch.float32
    assert linear(x).softmax(-1).dtype is torch.float32


def test_disable_casts_restores_even_when_the_block_raises(o1):
    a = torch.randn(2, 2)
    o1(torch.float16)
    with amp.disable_casts():
        assert torch.mm(a, a).dtype is torch.float32
    assert torch.mm(a, a).dtype is torch.float16
    with pytest.raises(ZeroDivisionError):
        with amp.disable_casts():
            1 / 0
    assert torch.mm(a, a).dtype is torch.float16


def test_sessions_take_the_cast_path_under_test(cast_path):
    from apexlite.amp.o1.native_casts import NATIVE_POLICIES, _native_module

    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    try:
        state = current_session().cast_state
        native = _native_module() is not None and isinstance(state, _native_module().CastState)
        assert native is (cast_path == "native")
        wrapper = torch.nn.functional.linear._self_wrapper
        assert (type(wrapper).__name__ == "CastWrapper") is (cast_path == "native")
        assert CastPolicy.LOW_PRECISION in NATIVE_POLICIES
    finally:
        amp.deinitialize()
