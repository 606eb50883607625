"""apex.normalization against torch.nn.functional.layer_norm and an fp32 RMSNorm reference."""
import pytest
import torch
import torch.nn.functional as F

from apexlite.compat.apex import normalization as N
from tests._helpers.tolerances import dtype_tols


def _rms_reference(x, weight, shape, eps):
    dims = tuple(range(-len(shape), 0))
    x = x.double()
    y = x / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)
    return y * weight.double() if weight is not None else y


def test_fused_layer_norm_matches_torch_layer_norm_and_grads():
    x = torch.randn(4, 6, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    ours = N.FusedLayerNorm([6, 8])
    ref = torch.nn.LayerNorm([6, 8])
    with torch.no_grad():
        ours.weight.copy_(torch.randn(6, 8))
        ours.bias.copy_(torch.randn(6, 8))
        ref.load_state_dict(ours.state_dict())
    out, out_ref = ours(x), ref(x_ref)
    torch.testing.assert_close(out, out_ref, **dtype_tols(torch.float32))
    out.square().sum().backward()
    out_ref.square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **dtype_tols(torch.float32))
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, **dtype_tols(torch.float32))
    assert repr(ours) == "FusedLayerNorm((6, 8), eps=1e-05, elementwise_affine=True)"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_norms_return_input_dtype_mixed_return_param_dtype(dtype):
    x = torch.randn(3, 16).to(dtype)
    assert N.FusedLayerNorm(16)(x).dtype is dtype
    assert N.FusedRMSNorm(16)(x).dtype is dtype
    assert N.MixedFusedLayerNorm(16)(x).dtype is torch.float32
    assert N.MixedFusedRMSNorm(16)(x).dtype is torch.float32
    expected = F.layer_norm(x.float(), (16,), eps=1e-5)
    torch.testing.assert_close(N.FusedLayerNorm(16)(x).float(), expected, **dtype_tols(dtype))


def test_fused_rms_norm_matches_reference():
    x = torch.randn(5, 4, 6)
    norm = N.FusedRMSNorm((4, 6), eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(4, 6))
    torch.testing.assert_close(norm(x).double(), _rms_reference(x, norm.weight, (4, 6), 1e-5))
    assert not hasattr(norm, "bias")


def test_functional_forms_default_eps_and_affine():
    x, w, b = torch.randn(3, 10), torch.randn(10), torch.randn(10)
    torch.testing.assert_close(N.fused_layer_norm_affine(x, w, b, 10), F.layer_norm(x, (10,), w, b, eps=1e-6))
    torch.testing.assert_close(N.fused_layer_norm(x, [10]), F.layer_norm(x, (10,), eps=1e-6))
    torch.testing.assert_close(N.fused_rms_norm_affine(x, w, 10).double(), _rms_reference(x, w, (10,), 1e-6))
    torch.testing.assert_close(N.fused_rms_norm(x, 10).double(), _rms_reference(x, None, (10,), 1e-6))
    assert N.mixed_dtype_fused_layer_norm_affine(x.half(), w, b, 10).dtype is torch.float32
    assert N.mixed_dtype_fused_rms_norm_affine(x.half(), w, 10).dtype is torch.float32


def test_functional_forms_follow_autocast_dtype():
    x, w, b = torch.randn(3, 10), torch.randn(10), torch.randn(10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert N.fused_layer_norm_affine(x, w, b, 10).dtype is torch.bfloat16


def test_mixed_variants_are_always_affine():
    with pytest.raises(RuntimeError, match="does not support `elementwise_affine = False`"):
        N.MixedFusedLayerNorm(8, elementwise_affine=False)
    with pytest.raises(RuntimeError, match="MixedFusedRMSNorm does not support"):
        N.MixedFusedRMSNorm(8, elementwise_affine=False)
    assert N.MixedFusedLayerNorm(8, elementwise_affine=True).weight.shape == (8,)
