"""apex.normalization(.fused_layer_norm) as apex has it: the package's names, the operator-style
functions (`*_fwd` with flat statistics, `*_bwd`, `*_fake`), `manual_rms_norm`, and the apex paths.

The modules, autograd Functions and functional API themselves are apexlite.normalization's, tested in
tests/normalization/.
"""
import importlib

import pytest
import torch
import torch.nn.functional as F

import apexlite.normalization as package
from apexlite.compat import apex_aliases
from apexlite.compat.apex import normalization as N
from apexlite.compat.apex.normalization import fused_layer_norm as FLN
from tests._helpers.norm_reference import DTYPES, SHAPE, check_against, grad_out, grads, inputs, rms_ref
from tests._helpers.tolerances import dtype_tols


@pytest.mark.parametrize("dtype", DTYPES)
def test_operator_forwards_return_flat_fp32_statistics(dtype):
    x, weight, bias = inputs(dtype, True)
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


def test_float64_operator_forward_keeps_float64_statistics():
    x, _, _ = inputs(torch.float64, True)
    _, mean, invvar = FLN.fused_layer_norm_fwd(x, SHAPE, 1e-5)
    assert mean.dtype is torch.float64 and invvar.dtype is torch.float64


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_operator_backwards_equal_autograd(memory_efficient):
    x, weight, bias = inputs(torch.float32, True)
    upstream = grad_out(x.shape)
    out, mean, invvar = FLN.fused_layer_norm_affine_fwd(x, weight, bias, list(SHAPE), 1e-5)
    saved = out if memory_efficient else x
    got = FLN.fused_layer_norm_affine_bwd(upstream, mean, invvar, saved, list(SHAPE), weight, bias, 1e-5,
                                          memory_efficient)
    want = grads(lambda x_, w_, b_: F.layer_norm(x_, SHAPE, w_, b_, 1e-5), x, weight, bias, upstream)[1:]
    check_against(got, want, torch.float32)
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in FLN.fused_layer_norm_affine_bwd_fake(
        upstream, mean, invvar, saved, list(SHAPE), weight, bias, 1e-5, memory_efficient)]
    out_rms, invvar_rms = FLN.fused_rms_norm_affine_fwd(x, weight, list(SHAPE), 1e-5)
    got = FLN.fused_rms_norm_affine_bwd(upstream, invvar_rms, out_rms if memory_efficient else x, list(SHAPE),
                                        weight, 1e-5, memory_efficient)
    want = grads(lambda x_, w_, b_: rms_ref(x_, w_, None, 1e-5), x, weight, None, upstream)[1:3]
    check_against(got, want, torch.float32)
    plain = FLN.fused_layer_norm_bwd(upstream, mean, invvar, x, SHAPE, 1e-5)
    check_against([plain], grads(lambda x_, w_, b_: F.layer_norm(x_, SHAPE, eps=1e-5), x, None, None,
                                 upstream)[1:2], torch.float32)


def test_operator_forward_is_differentiable_in_its_output():
    x, weight, bias = inputs(torch.float32, True)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out, mean, invvar = FLN.fused_layer_norm_affine_fwd(*leaves, list(SHAPE), 1e-5)
    assert not mean.requires_grad and not invvar.requires_grad
    out.sum().backward()
    assert all(leaf.grad is not None for leaf in leaves)


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
    torch.testing.assert_close(out.double(), rms_ref(x, w, None, 1e-5, shape=(16,)), **dtype_tols(input_dtype))
    assert FLN.manual_rms_norm(x, [16], None, 1e-5).dtype is torch.float32


# --- the package layout -----------------------------------------------------------------------------
def test_apex_names_are_apexlite_normalizations_objects():
    for name in package.__all__:
        assert getattr(FLN, name) is getattr(package, name), name


def test_apex_paths_resolve_to_the_submodule_not_a_function():
    with apex_aliases():
        apex_package = importlib.import_module("apex.normalization")
        submodule = importlib.import_module("apex.normalization.fused_layer_norm")
        from apex.normalization.fused_layer_norm import FusedLayerNorm, FusedLayerNormAffineFunction
        assert apex_package.fused_layer_norm is submodule is FLN
        assert FusedLayerNorm is apex_package.FusedLayerNorm
        assert FusedLayerNormAffineFunction is FLN.FusedLayerNormAffineFunction
    assert FLN.fused_layer_norm_cuda is None and FLN.supports_custom_op() is True
    apex_public = {"FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm", "fused_layer_norm"}
    assert {name for name in vars(N) if not name.startswith("_")} == apex_public


SCRIPTED = [(N.FusedLayerNorm, {}), (N.FusedLayerNorm, {"elementwise_affine": False}), (N.FusedRMSNorm, {}),
            (N.FusedRMSNorm, {"elementwise_affine": False}), (N.MixedFusedLayerNorm, {}), (N.MixedFusedRMSNorm, {})]


@pytest.mark.parametrize("cls,kwargs", SCRIPTED, ids=lambda v: getattr(v, "__name__", str(v)))
def test_the_modules_script_to_torchs_own_norm_as_apexs_did(cls, kwargs):
    """torch.jit.script takes apex's fallback (torch's layer_norm / rms_norm): the same output as eager."""
    module = cls(8, **kwargs)
    if module.elementwise_affine:
        torch.nn.init.normal_(module.weight)
    x = torch.randn(3, 8)
    torch.testing.assert_close(torch.jit.script(module)(x), module(x))
