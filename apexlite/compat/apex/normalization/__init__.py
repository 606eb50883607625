"""`apex.normalization`: the fused LayerNorm/RMSNorm modules; the rest lives in its submodule
`apex.normalization.fused_layer_norm` (see apexlite.normalization)."""
from apexlite.compat.apex.normalization import fused_layer_norm  # noqa: F401  (apex binds the submodule here)
from apexlite.compat.apex.normalization.fused_layer_norm import (  # noqa: F401
    FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm,
)
