"""`apex.normalization`: the fused LayerNorm/RMSNorm modules and functions (see apexlite.normalization)."""
from apexlite.normalization import (  # noqa: F401
    FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm, fused_layer_norm,
    fused_layer_norm_affine, fused_rms_norm, fused_rms_norm_affine, mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)
