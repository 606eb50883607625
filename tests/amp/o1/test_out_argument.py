"""Issue 18 item 1: a patched op called with `out=` writes the caller's tensor, exactly as plain torch does.

torch.autocast leaves `out=` calls uncast (its documentation: "calls that explicitly supply an out=...
Tensor ... won't go through autocasting"); O1 does the same. Which ops take `out=` is derived from the op
table: every entry whose unpatched op, called on its sample arguments with `out=`, returns that tensor.
"""
import types
import warnings

import pytest
import torch

from apexlite import amp
from apexlite.amp.o1.lists import op_entries
from apexlite.amp.o1.patcher import raw_attribute, resolve
from apexlite.amp.o1.policies import CastPolicy, map_tensors
from tests.amp.o1.cast_cases import CASES

pytestmark = pytest.mark.usefixtures("cast_path")  # native and pure-Python O1 casts

LOW_DTYPES = [torch.float16, torch.bfloat16]


def call(entry, args, kwargs):
    if entry.namespace == "torch.Tensor":
        return getattr(args[0], entry.name)(*args[1:], **kwargs)
    return getattr(resolve(entry.namespace), entry.name)(*args, **kwargs)


def quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args)


def _takes_out(entry) -> bool:
    """True when the unpatched op, on its sample arguments, writes a given `out=` tensor and returns it."""
    if entry.qualname not in CASES:
        return False
    args, kwargs = CASES[entry.qualname]()
    result = quietly(call, entry, args, kwargs)
    if not isinstance(result, torch.Tensor):
        return False
    out = torch.empty_like(result)
    try:
        return quietly(call, entry, args, {**kwargs, "out": out}) is out
    except TypeError:
        return False


OUT_ENTRIES = [entry for entry in op_entries() if _takes_out(entry)]


def to(dtype):
    return lambda t: t.to(dtype) if t.is_floating_point() else t


def scenario_args(entry, low):
    """The sample arguments in the dtypes the entry's policy would cast: fp32 for ops O1 runs in `low`,
    `low` for ops it runs in fp32, one `low` tensor among fp32 ones for the promoting ops."""
    args, kwargs = CASES[entry.qualname]()
    if entry.policy is CastPolicy.FLOAT:
        return map_tensors(args, to(low)), kwargs
    if entry.policy is CastPolicy.PROMOTE:
        return (args[0].to(low),) + tuple(args[1:]), kwargs
    if entry.policy is CastPolicy.SEQUENCE_PROMOTE:
        return ([args[0][0].to(low)] + list(args[0][1:]),) + tuple(args[1:]), kwargs
    return args, kwargs


def outcome(run, out):
    """('wrote', result is out, out) or ('raised', exception type, message) of `run(out)`."""
    try:
        result = quietly(run, out)
    except Exception as exc:  # the same failure as plain torch's is the expected behaviour
        return ("raised", type(exc), str(exc))
    return ("wrote", result is out, out)


def assert_same_outcome(got, expected):
    assert got[:2] == expected[:2]
    if got[0] == "wrote":
        assert got[2].dtype is expected[2].dtype
        torch.testing.assert_close(got[2], expected[2], rtol=0, atol=0, equal_nan=True)
    else:
        assert got[2] == expected[2]


@pytest.mark.parametrize("low", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("entry", OUT_ENTRIES, ids=lambda e: e.qualname)
def test_out_calls_run_uncast_and_write_the_callers_tensor(entry, low):
    """The wrapper hands an out= call to the unpatched op as it is. For a torch builtin that is plain
    torch's call; a Python-level op (F.normalize) still runs the patched ops it calls inside, so its
    reference is the unpatched function called directly in the same session."""
    args, kwargs = scenario_args(entry, low)
    try:  # plain torch without out=: the out tensor's dtype and shape
        reference = quietly(call, entry, args, kwargs)
    except RuntimeError:  # plain torch refuses these mixed dtypes (torch.dot): an fp32-shaped out, then
        reference = quietly(call, entry, *CASES[entry.qualname]())  # the same refusal is expected
    sentinel = torch.full_like(reference, 7.0)

    def through_the_name(out):
        return call(entry, args, {**kwargs, "out": out})

    original = raw_attribute(resolve(entry.namespace), entry.name)
    plain = outcome(through_the_name, sentinel.clone())
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=low, verbosity=0)
    try:
        got = outcome(through_the_name, sentinel.clone())
        direct = outcome(lambda out: original(*args, **kwargs, out=out), sentinel.clone())
    finally:
        amp.deinitialize()
    assert_same_outcome(got, direct)
    if not isinstance(original, types.FunctionType):
        assert_same_outcome(got, plain)


@pytest.mark.parametrize("low", LOW_DTYPES, ids=str)
def test_out_into_a_low_precision_tensor_from_fp32_inputs_is_torchs_own_error(low):
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with pytest.raises(RuntimeError) as plain:
        torch.mm(a, b, out=torch.empty(3, 2, dtype=low))
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=low, verbosity=0)
    try:
        out = torch.zeros(3, 2, dtype=low)
        with pytest.raises(RuntimeError) as patched:
            torch.mm(a, b, out=out)
    finally:
        amp.deinitialize()
    assert str(patched.value) == str(plain.value)
    assert torch.equal(out, torch.zeros(3, 2, dtype=low))


def test_out_none_is_an_ordinary_cast_call():
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.mm(a, b, out=None)
    amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
    try:
        got = torch.mm(a, b, out=None)
    finally:
        amp.deinitialize()
    assert got.dtype is torch.bfloat16
    assert torch.equal(got, expected)


def test_out_calls_match_torch_autocast():
    """The reference the rule is taken from: autocast runs an out= call uncast into the caller's tensor."""
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    x = torch.rand(5).to(torch.bfloat16)
    results = {}
    for mode in ("autocast", "o1"):
        mm_out, exp_out = torch.zeros(3, 2), torch.zeros(5, dtype=torch.bfloat16)
        if mode == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                returned = torch.mm(a, b, out=mm_out), torch.exp(x, out=exp_out)
        else:
            amp.initialize(torch.nn.Linear(2, 2), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
            try:
                returned = torch.mm(a, b, out=mm_out), torch.exp(x, out=exp_out)
            finally:
                amp.deinitialize()
        assert returned[0] is mm_out and returned[1] is exp_out
        results[mode] = (mm_out, exp_out)
    for got, expected in zip(results["o1"], results["autocast"]):
        assert got.dtype is expected.dtype
        assert torch.equal(got, expected)
