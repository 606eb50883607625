import torch
from apex.normalization import MixedFusedLayerNorm


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        # apexlite migrate: `memory_efficient` dropped: it only traded memory for recomputation inside
        #     apex's kernel
        self.norm = torch.nn.LayerNorm(width, eps=1e-6)
        self.rms = torch.nn.RMSNorm([width], eps=1e-05, elementwise_affine=False)
        self.other = torch.nn.LayerNorm(width)
        # TODO(apexlite migrate): `MixedFusedLayerNorm` has no certain torch rewrite
        #     (apex.normalization.MixedFusedLayerNorm: differs: torch ops (fp32 statistics) instead of
        #     apex's CUDA kernel, same results on any device; memory_efficient saves the output instead of
        #     the input, as apex did); see MIGRATION.md
        self.mixed = MixedFusedLayerNorm(width)
