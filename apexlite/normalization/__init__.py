"""apex's fused LayerNorm/RMSNorm on torch ops with fp32 statistics, on any device.

Dtype contract (apex's fused kernels): FusedLayerNorm/FusedRMSNorm and their functions return the
input's dtype; the Mixed* variants (always affine) return the parameters' dtype. Statistics are
computed in fp32 (float64 inputs in float64). Under torch.autocast the functions and modules first
cast their floating arguments (not float64) to the autocast dtype, as apex's did.

- `kernels`: the forward/backward maths (what apex's fused_layer_norm_cuda kernels computed);
- `functions`: the autograd Functions (apex's `.apply` argument order) and the functional API;
- `modules`: the torch.nn.Modules.
"""
from apexlite.normalization.functions import (
    FusedLayerNormAffineFunction, FusedLayerNormAffineMixedDtypesFunction, FusedLayerNormFunction,
    FusedRMSNormAffineFunction, FusedRMSNormAffineMixedDtypesFunction, FusedRMSNormFunction, fused_layer_norm,
    fused_layer_norm_affine, fused_rms_norm, fused_rms_norm_affine, mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)
from apexlite.normalization.modules import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm

__all__ = [
    "FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm",
    "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction",
    "fused_layer_norm", "fused_layer_norm_affine", "fused_rms_norm", "fused_rms_norm_affine",
    "mixed_dtype_fused_layer_norm_affine", "mixed_dtype_fused_rms_norm_affine",
]
