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
        # TODO(apexlite migrate): `MixedFusedLayerNorm` (apex.normalization.MixedFusedLayerNorm) has no
        #     exact torch rewrite: use torch.nn.LayerNorm (fp32 parameters) and call it on the input cast to
        #     its parameters' dtype (`norm(x.to(norm.weight.dtype))`): the mixed norm took fp16/bf16 inputs
        #     and returned that dtype
        self.mixed = MixedFusedLayerNorm(width)
