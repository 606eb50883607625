"""apexlite.normalization.modules against torch's layer norm and an fp64 RMSNorm reference.

Forward and gradients for fp32/fp16/bf16 inputs, affine or not, with and without `memory_efficient`;
apex's attributes, dtype rules, the Mixed* variants and the errors for mismatched shapes.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

from apexlite.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm
from apexlite.normalization.functions import LayerNormWithStatsFunction
from tests._helpers.norm_reference import (
    DTYPES, SHAPE, check_against, grad_out, grads, inputs, layer_norm_ref, rms_ref,
)

# (name, module factory, reference, has weight, has bias)
NORMS = [
    ("layer_affine", lambda me: FusedLayerNorm(SHAPE, memory_efficient=me), layer_norm_ref, True, True),
    ("layer", lambda me: FusedLayerNorm(SHAPE, elementwise_affine=False, memory_efficient=me),
     layer_norm_ref, False, False),
    ("rms_affine", lambda me: FusedRMSNorm(SHAPE, memory_efficient=me), rms_ref, True, False),
    ("rms", lambda me: FusedRMSNorm(SHAPE, elementwise_affine=False, memory_efficient=me), rms_ref, False, False),
]
CASES = list(itertools.product(NORMS, DTYPES, [False, True]))
CASE_IDS = [f"{norm[0]}-{str(dtype)[6:]}-{'memeff' if me else 'saved_input'}" for norm, dtype, me in CASES]


@pytest.mark.parametrize("norm,dtype,memory_efficient", CASES, ids=CASE_IDS)
def test_modules_forward_and_grads_match_fp32_statistics_reference(norm, dtype, memory_efficient):
    _, make, reference, has_weight, has_bias = norm
    module = make(memory_efficient)
    x, weight, bias = inputs(dtype, has_weight)
    bias = bias if has_bias else None
    with torch.no_grad():
        if has_weight:
            module.weight.copy_(weight)
        if has_bias:
            module.bias.copy_(bias)
    upstream = grad_out(x.shape, dtype)
    x_leaf = x.clone().requires_grad_()
    out = module(x_leaf)
    out.backward(upstream.to(out.dtype))
    got = (out.detach(), x_leaf.grad, module.weight.grad if has_weight else None,
           module.bias.grad if has_bias else None)
    # the reference: fp32 (or fp64) maths from the same low-precision input, then rounded like ours
    want_out, *want_grads = grads(lambda x_, w_, b_: reference(x_, w_, b_, module.eps), x.float(), weight, bias,
                                  upstream)
    assert got[0].dtype is dtype
    assert got[1].dtype is dtype and (not has_weight or got[2].dtype is torch.float32)
    check_against(got, (want_out.to(dtype), want_grads[0].to(dtype), *want_grads[1:]), dtype, memory_efficient)


def test_fp32_layer_norm_equals_torch_layer_norm_exactly():
    """Same input, same parameters: the output and every gradient are torch's own layer norm's."""
    x, weight, bias = inputs(torch.float32, True)
    upstream = grad_out(x.shape)
    module = FusedLayerNorm(SHAPE)
    reference = torch.nn.LayerNorm(SHAPE)
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
        reference.load_state_dict(module.state_dict())
    x_ours, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, out_ref = module(x_ours), reference(x_ref)
    out.backward(upstream)
    out_ref.backward(upstream)
    assert torch.equal(out, out_ref)
    assert torch.equal(x_ours.grad, x_ref.grad)
    assert torch.equal(module.weight.grad, reference.weight.grad)
    assert torch.equal(module.bias.grad, reference.bias.grad)


def test_float64_keeps_float64_statistics():
    x, _, _ = inputs(torch.float64, True)
    out = FusedLayerNorm(SHAPE).double()(x)
    assert out.dtype is torch.float64
    torch.testing.assert_close(out, F.layer_norm(x, SHAPE, eps=1e-5), rtol=1e-12, atol=1e-12)
    _, mean, invvar = LayerNormWithStatsFunction.apply(x, None, None, SHAPE, 1e-5)
    assert mean.dtype is torch.float64 and invvar.dtype is torch.float64


def test_modules_under_autocast_follow_the_functions():
    module = FusedLayerNorm(10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(2, 10))
    assert out.dtype is torch.bfloat16
    out.float().sum().backward()
    assert module.weight.grad.dtype is torch.float32


def test_module_attributes_and_repr_follow_apex():
    norm = FusedLayerNorm([6, 8], memory_efficient=True)
    assert norm.normalized_shape == torch.Size([6, 8]) and norm.memory_efficient is True
    assert repr(norm) == "FusedLayerNorm(torch.Size([6, 8]), eps=1e-05, elementwise_affine=True)"
    assert torch.equal(norm.weight, torch.ones(6, 8)) and torch.equal(norm.bias, torch.zeros(6, 8))
    rms = FusedRMSNorm(8, elementwise_affine=False)
    assert rms.weight is None and not hasattr(rms, "bias")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_norms_return_input_dtype_mixed_return_param_dtype(dtype):
    x = torch.randn(3, 16).to(dtype)
    assert FusedLayerNorm(16)(x).dtype is dtype
    assert FusedRMSNorm(16)(x).dtype is dtype
    assert MixedFusedLayerNorm(16)(x).dtype is torch.float32
    assert MixedFusedRMSNorm(16)(x).dtype is torch.float32


def test_mixed_variants_are_always_affine():
    with pytest.warns(UserWarning, match="does not support `elementwise_affine` argument"):
        with pytest.raises(RuntimeError, match="MixedFusedLayerNorm does not support `elementwise_affine = False`"):
            MixedFusedLayerNorm(8, elementwise_affine=False)
    with pytest.warns(UserWarning, match="MixedFusedRMSNorm does not support"):
        assert MixedFusedRMSNorm(8, elementwise_affine=True).weight.shape == (8,)
    with pytest.raises(TypeError, match="unexpected keyword"):
        MixedFusedLayerNorm(8, elementwise_afine=True)


@pytest.mark.parametrize("call,message", [
    (lambda: FusedLayerNorm(8)(torch.randn(2, 6)), "does not match the trailing dimensions"),
    (lambda: FusedRMSNorm([3, 4])(torch.randn(2, 4, 3)), "does not match the trailing dimensions"),
])
def test_shape_mismatches_raise_clearly(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("shape", ["768", 768.0, [7, "6"]], ids=repr)
def test_a_normalized_shape_that_is_not_ints_is_refused_as_torch_refuses_it(shape):
    """A string read from a config became shape (7, 6, 8) element by element; torch.nn.LayerNorm raises TypeError."""
    with pytest.raises(TypeError):
        torch.nn.LayerNorm(shape)
    for cls in (FusedLayerNorm, FusedRMSNorm):
        with pytest.raises(TypeError, match="normalized_shape must be an int or a sequence of ints"):
            cls(shape)
