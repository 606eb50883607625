"""Turn off torch's fused transformer inference path while O1 patches torch, as torch.autocast does.

In eval mode under `no_grad`, nn.TransformerEncoderLayer, nn.TransformerEncoder and nn.MultiheadAttention
may run one fused kernel (`torch._transformer_encoder_layer_fwd`, `torch._native_multi_head_attention`)
instead of their modules. torch skips it while autocast is on; O1 is not autocast, so the kernel would get
an fp16/bf16 activation (a Linear's output under O1) beside fp32 weights and fail with a dtype mismatch.
The module path runs the same math through O1's casts. torch's switch
(`torch.backends.mha.set_fastpath_enabled`) is process-wide: its value is recorded and restored with the
O1 patches.
"""
from __future__ import annotations

import torch

from apexlite.amp.o1.patcher import Patcher


def turn_off_transformer_fast_path(patcher: Patcher) -> None:
    """Switch the fused path off until the O1 patches are undone (a torch without the switch has no such path)."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        return
    previous = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    patcher.add_undo(lambda: mha.set_fastpath_enabled(previous),
                     "torch.backends.mha fast path turned off (restored to %s)" % previous)
