"""apexlite.normalization.functions: the autograd Functions through `.apply` (apex's argument order) and
the functional API (apex's default eps, mixed dtypes, torch.autocast), against torch's layer norm and an
fp64 RMSNorm reference."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from apexlite.normalization import functions as FN
from tests._helpers.norm_reference import SHAPE, check_against, grad_out, grads, inputs, layer_norm_ref, rms_ref
from tests._helpers.tolerances import dtype_tols

# (Function, builds apply's arguments from (x, w, b, shape, eps, me), reference, output dtype from (x, w))
FUNCTIONS = [
    (FN.FusedLayerNormAffineFunction, lambda x, w, b, s, e, m: (x, w, b, s, e, m),
     layer_norm_ref, lambda x, w: x.dtype),
    (FN.FusedLayerNormAffineMixedDtypesFunction, lambda x, w, b, s, e, m: (x, w, b, s, e, m),
     layer_norm_ref, lambda x, w: w.dtype),
    (FN.FusedLayerNormFunction, lambda x, w, b, s, e, m: (x, s, e, m),
     lambda x, w, b, e: layer_norm_ref(x, None, None, e), lambda x, w: x.dtype),
    (FN.FusedRMSNormAffineFunction, lambda x, w, b, s, e, m: (x, w, s, e, m),
     lambda x, w, b, e: rms_ref(x, w, None, e), lambda x, w: x.dtype),
    (FN.FusedRMSNormAffineMixedDtypesFunction, lambda x, w, b, s, e, m: (x, w, s, e, m),
     lambda x, w, b, e: rms_ref(x, w, None, e), lambda x, w: w.dtype),
    (FN.FusedRMSNormFunction, lambda x, w, b, s, e, m: (x, s, e, m),
     lambda x, w, b, e: rms_ref(x, None, None, e), lambda x, w: x.dtype),
]
FUNCTION_CASES = list(itertools.product(FUNCTIONS, [torch.float16, torch.bfloat16, torch.float32], [False, True]))
FUNCTION_IDS = [f"{fn[0].__name__}-{str(dtype)[6:]}-{'memeff' if me else 'saved_input'}"
                for fn, dtype, me in FUNCTION_CASES]


@pytest.mark.parametrize("function,dtype,memory_efficient", FUNCTION_CASES, ids=FUNCTION_IDS)
def test_autograd_functions_apply_with_apex_argument_order(function, dtype, memory_efficient):
    cls, arguments, reference, out_dtype = function
    x, weight, bias = inputs(dtype, True)
    eps = 1e-5
    upstream = grad_out(x.shape, dtype)
    takes_weight = len(arguments(x, weight, bias, SHAPE, eps, memory_efficient)) >= 5
    takes_bias = len(arguments(x, weight, bias, SHAPE, eps, memory_efficient)) == 6
    used = (weight if takes_weight else None, bias if takes_bias else None)
    got = grads(lambda x_, w_, b_: cls.apply(*arguments(x_, w_, b_, SHAPE, eps, memory_efficient)), x, *used,
                upstream)
    assert got[0].dtype is out_dtype(x, weight)
    want = grads(lambda x_, w_, b_: reference(x_, w_, b_, eps), x.float(), *used, upstream)
    check_against(got, (want[0].to(got[0].dtype), want[1].to(dtype), *want[2:]), dtype, memory_efficient)


def test_functions_default_eps_is_apexs():
    x, w, b = torch.randn(3, 10), torch.randn(10), torch.randn(10)
    torch.testing.assert_close(FN.fused_layer_norm_affine(x, w, b, 10), F.layer_norm(x, (10,), w, b, eps=1e-6))
    torch.testing.assert_close(FN.fused_layer_norm(x, [10]), F.layer_norm(x, (10,), eps=1e-6))
    rms = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(FN.fused_rms_norm_affine(x, w, 10).double(), rms * w.double())
    torch.testing.assert_close(FN.fused_rms_norm(x, 10).double(), rms)
    assert FN.mixed_dtype_fused_layer_norm_affine(x.half(), w, b, 10).dtype is torch.float32
    assert FN.mixed_dtype_fused_rms_norm_affine(x.half(), w, 10).dtype is torch.float32


# (function, arguments after the input, reference on fp32 tensors)
AUTOCAST_FUNCTIONS = [
    (FN.fused_layer_norm_affine, "wb", lambda x, w, b: F.layer_norm(x, (10,), w, b, eps=1e-6)),
    (FN.fused_layer_norm, "", lambda x, w, b: F.layer_norm(x, (10,), eps=1e-6)),
    (FN.mixed_dtype_fused_layer_norm_affine, "wb", lambda x, w, b: F.layer_norm(x, (10,), w, b, eps=1e-6)),
    (FN.fused_rms_norm_affine, "w",
     lambda x, w, b: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w),
    (FN.fused_rms_norm, "", lambda x, w, b: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)),
    (FN.mixed_dtype_fused_rms_norm_affine, "w",
     lambda x, w, b: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w),
]


@pytest.mark.parametrize("function,params,reference", AUTOCAST_FUNCTIONS,
                         ids=[f[0].__name__ for f in AUTOCAST_FUNCTIONS])
def test_functions_under_autocast_cast_their_arguments_first(function, params, reference):
    """apex's functions cast input and parameters to the autocast dtype, then normalised with fp32 stats."""
    x = torch.randn(3, 10, requires_grad=True)
    w = torch.randn(10, requires_grad=True)
    b = torch.randn(10, requires_grad=True)
    args = [x] + [{"w": w, "b": b}[name] for name in params] + [10]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = function(*args)
    assert out.dtype is torch.bfloat16
    low = [t.detach().to(torch.bfloat16).float() for t in (x, w, b)]
    torch.testing.assert_close(out.float(), reference(*low).to(torch.bfloat16).float(), **dtype_tols(torch.bfloat16))
    out.float().sum().backward()
    assert x.grad.dtype is torch.float32 and (not params or w.grad.dtype is torch.float32)


def test_memory_efficient_backward_stays_finite_for_zero_weights():
    """The output is divided by the weight to recover x-hat; apex clamped |weight| to eps, so do we."""
    x, weight, bias = inputs(torch.float32, True)
    weight[0, :3] = 0.0
    out = grads(lambda x_, w_, b_: FN.fused_layer_norm_affine(x_, w_, b_, SHAPE, 1e-5, True), x, weight, bias,
                grad_out(x.shape))
    assert all(torch.isfinite(t).all() for t in out[1:])


def test_weight_of_the_wrong_shape_raises_clearly():
    with pytest.raises(RuntimeError, match="weight/bias"):
        FN.fused_layer_norm_affine(torch.randn(2, 8), torch.ones(4), torch.zeros(8), 8)
