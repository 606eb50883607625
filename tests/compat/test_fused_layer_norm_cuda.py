"""`fused_layer_norm_cuda` (apexlite.compat.fused_layer_norm_cuda) against torch's layer norm in fp32 and an
fp64 RMSNorm: apex's argument orders, its return lists, the statistics' shapes and dtypes, and the
gradients of the backwards against autograd of the reference."""
import pytest
import torch
import torch.nn.functional as F

from apexlite.compat import fused_layer_norm_cuda as ext
from tests._helpers.norm_reference import (
    DTYPES, SHAPE, check_against, grad_out, grads, inputs, layer_norm_ref, rms_ref,
)
from tests._helpers.tolerances import dtype_tols

EPS = 1e-5
ROWS = 12  # inputs() gives (4, 3) rows of SHAPE


def _stats_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# (name, forward call on (x, w, b), reference on fp32 (x, w, b), output dtype from (x, w), returns mean)
FORWARDS = [
    ("forward_affine", lambda x, w, b: ext.forward_affine(x, SHAPE, w, b, EPS),
     lambda x, w, b: layer_norm_ref(x, w, b, EPS), lambda x, w: x.dtype, True),
    ("forward", lambda x, w, b: ext.forward(x, SHAPE, EPS),
     lambda x, w, b: layer_norm_ref(x, None, None, EPS), lambda x, w: x.dtype, True),
    ("forward_affine_mixed_dtypes", lambda x, w, b: ext.forward_affine_mixed_dtypes(x, SHAPE, w, b, EPS),
     lambda x, w, b: layer_norm_ref(x, w, b, EPS), lambda x, w: w.dtype, True),
    ("rms_forward_affine", lambda x, w, b: ext.rms_forward_affine(x, SHAPE, w, EPS),
     lambda x, w, b: rms_ref(x, w, None, EPS), lambda x, w: x.dtype, False),
    ("rms_forward", lambda x, w, b: ext.rms_forward(x, SHAPE, EPS),
     lambda x, w, b: rms_ref(x, None, None, EPS), lambda x, w: x.dtype, False),
    ("rms_forward_affine_mixed_dtypes", lambda x, w, b: ext.rms_forward_affine_mixed_dtypes(x, SHAPE, w, EPS),
     lambda x, w, b: rms_ref(x, w, None, EPS), lambda x, w: w.dtype, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize("name,call,reference,out_dtype,has_mean", FORWARDS, ids=[f[0] for f in FORWARDS])
def test_forwards_return_apexs_list_with_flat_statistics(name, call, reference, out_dtype, has_mean, dtype):
    x, weight, bias = inputs(dtype, True)
    result = call(x, weight, bias)
    assert isinstance(result, list) and len(result) == (3 if has_mean else 2)
    output, *stats = result
    assert output.dtype is out_dtype(x, weight) and output.shape == x.shape
    want = reference(x.float(), weight, bias)
    torch.testing.assert_close(output.float(), want.to(output.dtype).float(), **dtype_tols(dtype))
    rows = x.float().reshape(ROWS, -1)
    expected = ([rows.mean(-1), torch.rsqrt(rows.var(-1, unbiased=False) + EPS)] if has_mean
                else [torch.rsqrt(rows.square().mean(-1) + EPS)])
    for got, wanted in zip(stats, expected):
        assert got.shape == (ROWS,) and got.dtype is _stats_dtype(dtype)
        torch.testing.assert_close(got, wanted)


def test_fp32_forward_affine_is_torchs_layer_norm():
    x, weight, bias = inputs(torch.float32, True)
    output, mean, invvar = ext.forward_affine(x, torch.Size(SHAPE), weight, bias, EPS)
    assert torch.equal(output, F.layer_norm(x, SHAPE, weight, bias, EPS))
    assert torch.equal(mean, torch.native_layer_norm(x, SHAPE, weight, bias, EPS)[1].reshape(-1))


# (name, backward call on (dout, x, w, b, memory_efficient), forward whose autograd is the reference, affine)
BACKWARDS = [
    ("backward_affine", True, False),
    ("backward", False, False),
    ("rms_backward_affine", True, True),
    ("rms_backward", False, True),
]


def _backward(name, dout, x, weight, bias, memory_efficient):
    """apex's backward call for `name`, fed by the matching forward (output saved with memory_efficient)."""
    rms = name.startswith("rms")
    affine = name.endswith("affine")
    if rms:
        output, invvar = (ext.rms_forward_affine(x, SHAPE, weight, EPS) if affine else ext.rms_forward(x, SHAPE, EPS))
        saved = output if memory_efficient else x
        if affine:
            return ext.rms_backward_affine(dout, invvar, saved, SHAPE, weight, EPS, memory_efficient)
        return [ext.rms_backward(dout, invvar, saved, SHAPE, EPS, memory_efficient)]
    output, mean, invvar = (ext.forward_affine(x, SHAPE, weight, bias, EPS) if affine else ext.forward(x, SHAPE, EPS))
    saved, mean = (output, None) if memory_efficient else (x, mean)
    if affine:
        return ext.backward_affine(dout, mean, invvar, saved, SHAPE, weight, bias, EPS, memory_efficient)
    return [ext.backward(dout, mean, invvar, saved, SHAPE, EPS, memory_efficient)]


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["saved_input", "memory_efficient"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize("name,affine,rms", BACKWARDS, ids=[b[0] for b in BACKWARDS])
def test_backwards_equal_autograd_of_the_reference(name, affine, rms, dtype, memory_efficient):
    x, weight, bias = inputs(dtype, True)
    weight, bias = (weight, None if rms else bias) if affine else (None, None)
    upstream = grad_out(x.shape, dtype)
    got = _backward(name, upstream.to(dtype), x, weight, bias, memory_efficient)
    assert got[0].dtype is dtype and all(g.dtype is torch.float32 for g in got[1:])
    reference = (lambda x_, w_, b_: rms_ref(x_, w_, None, EPS)) if rms else \
        (lambda x_, w_, b_: layer_norm_ref(x_, w_, b_, EPS))
    want = grads(reference, x.float(), weight, bias, upstream)[1:]
    want = [want[0].to(dtype)] + [w for w in want[1:] if w is not None]
    check_against([None] + got, [None] + want, dtype, memory_efficient)


def test_backward_affine_takes_the_older_eight_argument_call():
    """Megatron-LM 2022-23 called apex's backward without memory_efficient (older apex had none)."""
    x, weight, bias = inputs(torch.float32, True)
    upstream = grad_out(x.shape)
    _, mean, invvar = ext.forward_affine(x, SHAPE, weight, bias, EPS)
    got = ext.backward_affine(upstream, mean, invvar, x, SHAPE, weight, bias, EPS)
    want = grads(lambda x_, w_, b_: F.layer_norm(x_, SHAPE, w_, b_, EPS), x, weight, bias, upstream)[1:]
    check_against([None] + got, [None] + list(want), torch.float32)


def test_the_functions_record_no_autograd_graph_and_ignore_autocast():
    """They are the insides of an autograd Function, as apex's extension functions were."""
    x, weight, bias = (t.clone().requires_grad_() for t in inputs(torch.float32, True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, mean, invvar = ext.forward_affine(x, SHAPE, weight, bias, EPS)
    assert output.dtype is torch.float32
    assert not any(t.requires_grad for t in (output, mean, invvar))


def test_a_missing_mean_needs_memory_efficient():
    x, weight, bias = inputs(torch.float32, True)
    _, _, invvar = ext.forward_affine(x, SHAPE, weight, bias, EPS)
    with pytest.raises(ValueError, match="mean is None, which only memory_efficient=True allows"):
        ext.backward_affine(grad_out(x.shape), None, invvar, x, SHAPE, weight, bias, EPS)


@pytest.mark.parametrize("call,message", [
    (lambda: ext.forward_affine(torch.randn(2, 6), [8], torch.ones(8), torch.zeros(8), EPS),
     "does not match the trailing dimensions"),
    (lambda: ext.rms_forward_affine(torch.randn(2, 8), [8], torch.ones(4), EPS), "weight/bias"),
])
def test_shape_mismatches_raise_clearly(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
