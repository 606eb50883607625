"""apex.normalization(.fused_layer_norm) against torch's layer norm and an fp64 RMSNorm reference.

Forward and gradients, for fp32/fp16/bf16 inputs, affine or not, with and without
`memory_efficient`, through the modules, the functions and the autograd Functions' `.apply`
(apex's argument order), and under torch.autocast as apex's functions behaved.
"""
import importlib
import itertools

import pytest
import torch
import torch.nn.functional as F

from apexlite.compat import apex_aliases
from apexlite.compat.apex import normalization as N
from apexlite.compat.apex.normalization import fused_layer_norm as FLN
from tests._helpers.tolerances import dtype_tols

SHAPE = (6, 8)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(dtype, affine, batch=(4, 3)):
    x = (torch.randn(*batch, *SHAPE) * 3 + 1).to(dtype)
    weight = (torch.rand(SHAPE) + 0.5) * torch.where(torch.rand(SHAPE) > 0.5, 1.0, -1.0) if affine else None
    bias = torch.randn(SHAPE) if affine else None
    return x, weight, bias


def _grad_out(shape, dtype=torch.float32, seed=7):
    """An upstream gradient whose values the low-precision dtype holds exactly (both sides see the same)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).float()


def _layer_norm_ref(x, weight, bias, eps):
    """torch's layer norm in fp32 (fp64 stays fp64): the fp32-statistics reference."""
    dtype = torch.float64 if x.dtype is torch.float64 else torch.float32
    cast = (lambda t: None if t is None else t.to(dtype))
    return F.layer_norm(x.to(dtype), SHAPE, cast(weight), cast(bias), eps)


def _rms_ref(x, weight, bias, eps):
    x = x.double()
    y = x * torch.rsqrt(x.square().mean((-2, -1), keepdim=True) + eps)
    return y if weight is None else y * weight.double()


def _grads(fn, x, weight, bias, grad_out):
    """(output, d input, d weight, d bias) of fn on fresh leaf copies."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = fn(*leaves)
    out.backward(grad_out.to(out.dtype))
    return (out.detach(), *[None if t is None else t.grad for t in leaves])


# memory_efficient recovers the normalised values from the saved low-precision output, as apex did,
# so its gradients carry that output's rounding (an ulp of the output, over |weight|, summed over rows).
MEMORY_EFFICIENT_SLACK = 4


def _check_against(ours, reference, dtype, memory_efficient=False):
    output_tols = dtype_tols(dtype)
    grad_tols = dict(output_tols)
    if memory_efficient and dtype is not torch.float32:
        grad_tols["atol"] *= MEMORY_EFFICIENT_SLACK
    for index, (got, want) in enumerate(zip(ours, reference)):
        if want is None:
            assert got is None
            continue
        torch.testing.assert_close(got.float(), want.float(), **(output_tols if index == 0 else grad_tols))


# (name, module factory, reference, has weight, has bias)
NORMS = [
    ("layer_affine", lambda me: N.FusedLayerNorm(SHAPE, memory_efficient=me), _layer_norm_ref, True, True),
    ("layer", lambda me: N.FusedLayerNorm(SHAPE, elementwise_affine=False, memory_efficient=me),
     _layer_norm_ref, False, False),
    ("rms_affine", lambda me: N.FusedRMSNorm(SHAPE, memory_efficient=me), _rms_ref, True, False),
    ("rms", lambda me: N.FusedRMSNorm(SHAPE, elementwise_affine=False, memory_efficient=me), _rms_ref, False, False),
]
CASES = list(itertools.product(NORMS, DTYPES, [False, True]))
CASE_IDS = [f"{norm[0]}-{str(dtype)[6:]}-{'memeff' if me else 'saved_input'}" for norm, dtype, me in CASES]


@pytest.mark.parametrize("norm,dtype,memory_efficient", CASES, ids=CASE_IDS)
def test_modules_forward_and_grads_match_fp32_statistics_reference(norm, dtype, memory_efficient):
    _, make, reference, has_weight, has_bias = norm
    module = make(memory_efficient)
    x, weight, bias = _inputs(dtype, has_weight)
    bias = bias if has_bias else None
    with torch.no_grad():
        if has_weight:
            module.weight.copy_(weight)
        if has_bias:
            module.bias.copy_(bias)
    grad_out = _grad_out(x.shape, dtype)
    x_leaf = x.clone().requires_grad_()
    out = module(x_leaf)
    out.backward(grad_out.to(out.dtype))
    got = (out.detach(), x_leaf.grad, module.weight.grad if has_weight else None,
           module.bias.grad if has_bias else None)
    # the reference: fp32 (or fp64) maths from the same low-precision input, then rounded like ours
    want_out, *want_grads = _grads(lambda x_, w_, b_: reference(x_, w_, b_, module.eps), x.float(), weight, bias,
                                   grad_out)
    assert got[0].dtype is dtype
    assert got[1].dtype is dtype and (not has_weight or got[2].dtype is torch.float32)
    _check_against(got, (want_out.to(dtype), want_grads[0].to(dtype), *want_grads[1:]), dtype, memory_efficient)


def test_fp32_layer_norm_equals_torch_layer_norm_exactly():
    """Same input, same parameters: the output and every gradient are torch's own layer norm's."""
    x, weight, bias = _inputs(torch.float32, True)
    grad_out = _grad_out(x.shape)
    module = N.FusedLayerNorm(SHAPE)
    reference = torch.nn.LayerNorm(SHAPE)
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
        reference.load_state_dict(module.state_dict())
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, out_ref = module(x_ours), reference(x_ref)
    out.backward(grad_out)
    out_ref.backward(grad_out)
    assert torch.equal(out, out_ref)
    assert torch.equal(x_ours.grad, x_ref.grad)
    assert torch.equal(module.weight.grad, reference.weight.grad)
    assert torch.equal(module.bias.grad, reference.bias.grad)


def test_float64_keeps_float64_statistics():
    x, weight, bias = _inputs(torch.float64, True)
    out = N.FusedLayerNorm(SHAPE).double()(x)
    assert out.dtype is torch.float64
    torch.testing.assert_close(out, F.layer_norm(x, SHAPE, eps=1e-5), rtol=1e-12, atol=1e-12)
    _, mean, invvar = FLN.fused_layer_norm_fwd(x, SHAPE, 1e-5)
    assert mean.dtype is torch.float64 and invvar.dtype is torch.float64


# --- the autograd Functions through .apply, apex's argument order ----------------------------------
# (Function, builds apply's arguments from (x, w, b, shape, eps, me), reference, output dtype from (x, w))
FUNCTIONS = [
    (N.fused_layer_norm.FusedLayerNormAffineFunction, lambda x, w, b, s, e, m: (x, w, b, s, e, m),
     _layer_norm_ref, lambda x, w: x.dtype),
    (FLN.FusedLayerNormAffineMixedDtypesFunction, lambda x, w, b, s, e, m: (x, w, b, s, e, m),
     _layer_norm_ref, lambda x, w: w.dtype),
    (FLN.FusedLayerNormFunction, lambda x, w, b, s, e, m: (x, s, e, m),
     lambda x, w, b, e: _layer_norm_ref(x, None, None, e), lambda x, w: x.dtype),
    (FLN.FusedRMSNormAffineFunction, lambda x, w, b, s, e, m: (x, w, s, e, m),
     lambda x, w, b, e: _rms_ref(x, w, None, e), lambda x, w: x.dtype),
    (FLN.FusedRMSNormAffineMixedDtypesFunction, lambda x, w, b, s, e, m: (x, w, s, e, m),
     lambda x, w, b, e: _rms_ref(x, w, None, e), lambda x, w: w.dtype),
    (FLN.FusedRMSNormFunction, lambda x, w, b, s, e, m: (x, s, e, m),
     lambda x, w, b, e: _rms_ref(x, None, None, e), lambda x, w: x.dtype),
]
FUNCTION_CASES = list(itertools.product(FUNCTIONS, [torch.float16, torch.bfloat16, torch.float32], [False, True]))
FUNCTION_IDS = [f"{fn[0].__name__}-{str(dtype)[6:]}-{'memeff' if me else 'saved_input'}"
                for fn, dtype, me in FUNCTION_CASES]


@pytest.mark.parametrize("function,dtype,memory_efficient", FUNCTION_CASES, ids=FUNCTION_IDS)
def test_autograd_functions_apply_with_apex_argument_order(function, dtype, memory_efficient):
    cls, arguments, reference, out_dtype = function
    x, weight, bias = _inputs(dtype, True)
    eps = 1e-5
    grad_out = _grad_out(x.shape, dtype)
    takes_weight = len(arguments(x, weight, bias, SHAPE, eps, memory_efficient)) >= 5
    takes_bias = len(arguments(x, weight, bias, SHAPE, eps, memory_efficient)) == 6
    used = (weight if takes_weight else None, bias if takes_bias else None)
    got = _grads(lambda x_, w_, b_: cls.apply(*arguments(x_, w_, b_, SHAPE, eps, memory_efficient)), x, *used,
                 grad_out)
    assert got[0].dtype is out_dtype(x, weight)
    want = _grads(lambda x_, w_, b_: reference(x_, w_, b_, eps), x.float(), *used, grad_out)
    _check_against(got, (want[0].to(got[0].dtype), want[1].to(dtype), *want[2:]), dtype, memory_efficient)


# --- functions: defaults, mixed dtypes, autocast ----------------------------------------------------
def test_functions_default_eps_is_apexs():
    x, w, b = torch.randn(3, 10), torch.randn(10), torch.randn(10)
    torch.testing.assert_close(N.fused_layer_norm.fused_layer_norm_affine(x, w, b, 10),
                               F.layer_norm(x, (10,), w, b, eps=1e-6))
    torch.testing.assert_close(FLN.fused_layer_norm(x, [10]), F.layer_norm(x, (10,), eps=1e-6))
    rms = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(FLN.fused_rms_norm_affine(x, w, 10).double(), rms * w.double())
    torch.testing.assert_close(FLN.fused_rms_norm(x, 10).double(), rms)
    assert FLN.mixed_dtype_fused_layer_norm_affine(x.half(), w, b, 10).dtype is torch.float32
    assert FLN.mixed_dtype_fused_rms_norm_affine(x.half(), w, 10).dtype is torch.float32


# (function, arguments after the input, reference on fp32 tensors)
AUTOCAST_FUNCTIONS = [
    (FLN.fused_layer_norm_affine, "wb", lambda x, w, b: F.layer_norm(x, (10,), w, b, eps=1e-6)),
    (FLN.fused_layer_norm, "", lambda x, w, b: F.layer_norm(x, (10,), eps=1e-6)),
    (FLN.mixed_dtype_fused_layer_norm_affine, "wb", lambda x, w, b: F.layer_norm(x, (10,), w, b, eps=1e-6)),
    (FLN.fused_rms_norm_affine, "w",
     lambda x, w, b: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w),
    (FLN.fused_rms_norm, "", lambda x, w, b: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)),
    (FLN.mixed_dtype_fused_rms_norm_affine, "w",
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


def test_modules_under_autocast_follow_the_functions():
    module = N.FusedLayerNorm(10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(2, 10))
    assert out.dtype is torch.bfloat16
    out.float().sum().backward()
    assert module.weight.grad.dtype is torch.float32


# --- statistics, operator-style functions, shape functions ------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_operator_forwards_return_flat_fp32_statistics(dtype):
    x, weight, bias = _inputs(dtype, True)
    out, mean, invvar = FLN.fused_layer_norm_affine_fwd(x, weight, bias, list(SHAPE), 1e-5)
    rows = x.float().reshape(-1, 48)
    torch.testing.assert_close(mean, rows.mean(-1))
    torch.testing.assert_close(invvar, torch.rsqrt(rows.var(-1, unbiased=False) + 1e-5))
    assert mean.shape == (12,) and mean.dtype is torch.float32 and out.dtype is dtype
    out_rms, invvar_rms = FLN.fused_rms_norm_affine_fwd(x, weight, list(SHAPE), 1e-5)
    torch.testing.assert_close(invvar_rms, torch.rsqrt(rows.square().mean(-1) + 1e-5))
    for fake, real in ((FLN.fused_layer_norm_affine_fwd_fake(x, weight, bias, list(SHAPE), 1e-5), (out, mean, invvar)),
                       (FLN.fused_rms_norm_affine_fwd_fake(x, weight, list(SHAPE), 1e-5), (out_rms, invvar_rms)),
                       (FLN.fused_layer_norm_fwd_fake(x, list(SHAPE), 1e-5), FLN.fused_layer_norm_fwd(x, SHAPE, 1e-5)),
                       (FLN.fused_rms_norm_fwd_fake(x, list(SHAPE), 1e-5), FLN.fused_rms_norm_fwd(x, SHAPE, 1e-5))):
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_operator_backwards_equal_autograd(memory_efficient):
    x, weight, bias = _inputs(torch.float32, True)
    grad_out = _grad_out(x.shape)
    out, mean, invvar = FLN.fused_layer_norm_affine_fwd(x, weight, bias, list(SHAPE), 1e-5)
    saved = out if memory_efficient else x
    got = FLN.fused_layer_norm_affine_bwd(grad_out, mean, invvar, saved, list(SHAPE), weight, bias, 1e-5,
                                          memory_efficient)
    want = _grads(lambda x_, w_, b_: F.layer_norm(x_, SHAPE, w_, b_, 1e-5), x, weight, bias, grad_out)[1:]
    _check_against(got, want, torch.float32)
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in FLN.fused_layer_norm_affine_bwd_fake(
        grad_out, mean, invvar, saved, list(SHAPE), weight, bias, 1e-5, memory_efficient)]
    out_rms, invvar_rms = FLN.fused_rms_norm_affine_fwd(x, weight, list(SHAPE), 1e-5)
    got = FLN.fused_rms_norm_affine_bwd(grad_out, invvar_rms, out_rms if memory_efficient else x, list(SHAPE),
                                        weight, 1e-5, memory_efficient)
    want = _grads(lambda x_, w_, b_: _rms_ref(x_, w_, None, 1e-5), x, weight, None, grad_out)[1:3]
    _check_against(got, want, torch.float32)
    plain = FLN.fused_layer_norm_bwd(grad_out, mean, invvar, x, SHAPE, 1e-5)
    _check_against([plain], _grads(lambda x_, w_, b_: F.layer_norm(x_, SHAPE, eps=1e-5), x, None, None,
                                   grad_out)[1:2], torch.float32)


def test_operator_forward_is_differentiable_in_its_output():
    x, weight, bias = _inputs(torch.float32, True)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out, mean, invvar = FLN.fused_layer_norm_affine_fwd(*leaves, list(SHAPE), 1e-5)
    assert not mean.requires_grad and not invvar.requires_grad
    out.sum().backward()
    assert all(leaf.grad is not None for leaf in leaves)


def test_memory_efficient_backward_stays_finite_for_zero_weights():
    """The output is divided by the weight to recover x-hat; apex clamped |weight| to eps, so do we."""
    x, weight, bias = _inputs(torch.float32, True)
    weight[0, :3] = 0.0
    out = _grads(lambda x_, w_, b_: FLN.fused_layer_norm_affine(x_, w_, b_, SHAPE, 1e-5, True), x, weight, bias,
                 _grad_out(x.shape))
    assert all(torch.isfinite(t).all() for t in out[1:])


# --- manual_rms_norm (apex's unfused reference) -----------------------------------------------------
@pytest.mark.parametrize("input_dtype,weight_dtype,out_dtype", [
    (torch.float32, torch.float32, torch.float32),
    (torch.float16, torch.float32, torch.float32),
    (torch.float16, torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
])
def test_manual_rms_norm_dtype_rules_and_values(input_dtype, weight_dtype, out_dtype):
    x = torch.randn(3, 16).to(input_dtype)
    w = torch.randn(16).to(weight_dtype)
    out = FLN.manual_rms_norm(x, [16], w, 1e-5)
    assert out.dtype is out_dtype
    torch.testing.assert_close(out.double(), _rms_ref_1d(x, w), **dtype_tols(input_dtype))
    assert FLN.manual_rms_norm(x, [16], None, 1e-5).dtype is torch.float32


def _rms_ref_1d(x, w):
    x = x.double()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w.double()


# --- module attributes, errors, the package layout ---------------------------------------------------
def test_module_attributes_and_repr_follow_apex():
    norm = N.FusedLayerNorm([6, 8], memory_efficient=True)
    assert norm.normalized_shape == torch.Size([6, 8]) and norm.memory_efficient is True
    assert repr(norm) == "FusedLayerNorm(torch.Size([6, 8]), eps=1e-05, elementwise_affine=True)"
    assert torch.equal(norm.weight, torch.ones(6, 8)) and torch.equal(norm.bias, torch.zeros(6, 8))
    rms = N.FusedRMSNorm(8, elementwise_affine=False)
    assert rms.weight is None and not hasattr(rms, "bias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_norms_return_input_dtype_mixed_return_param_dtype(dtype):
    x = torch.randn(3, 16).to(dtype)
    assert N.FusedLayerNorm(16)(x).dtype is dtype
    assert N.FusedRMSNorm(16)(x).dtype is dtype
    assert N.MixedFusedLayerNorm(16)(x).dtype is torch.float32
    assert N.MixedFusedRMSNorm(16)(x).dtype is torch.float32


def test_mixed_variants_are_always_affine():
    with pytest.warns(UserWarning, match="does not support `elementwise_affine` argument"):
        with pytest.raises(RuntimeError, match="MixedFusedLayerNorm does not support `elementwise_affine = False`"):
            N.MixedFusedLayerNorm(8, elementwise_affine=False)
    with pytest.warns(UserWarning, match="MixedFusedRMSNorm does not support"):
        assert N.MixedFusedRMSNorm(8, elementwise_affine=True).weight.shape == (8,)
    with pytest.raises(TypeError, match="unexpected keyword"):
        N.MixedFusedLayerNorm(8, elementwise_afine=True)


@pytest.mark.parametrize("call,message", [
    (lambda: N.FusedLayerNorm(8)(torch.randn(2, 6)), "does not match the trailing dimensions"),
    (lambda: N.FusedRMSNorm([3, 4])(torch.randn(2, 4, 3)), "does not match the trailing dimensions"),
    (lambda: FLN.fused_layer_norm_affine(torch.randn(2, 8), torch.ones(4), torch.zeros(8), 8), "weight/bias"),
])
def test_shape_mismatches_raise_clearly(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_apex_paths_resolve_to_the_submodule_not_a_function():
    with apex_aliases():
        package = importlib.import_module("apex.normalization")
        submodule = importlib.import_module("apex.normalization.fused_layer_norm")
        from apex.normalization.fused_layer_norm import FusedLayerNorm, FusedLayerNormAffineFunction
        assert package.fused_layer_norm is submodule is FLN
        assert FusedLayerNorm is package.FusedLayerNorm
        assert FusedLayerNormAffineFunction is FLN.FusedLayerNormAffineFunction
    assert FLN.fused_layer_norm_cuda is None and FLN.supports_custom_op() is True
    apex_public = {"FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm", "fused_layer_norm"}
    assert {name for name in vars(N) if not name.startswith("_")} == apex_public
