"""`scaled_upper_triang_masked_softmax_cuda`: apex's Megatron causal softmax of scaled attention scores.

`forward(input, scale)` takes a 3D fp16/bf16 tensor [batches * heads, queries, keys] and returns
softmax(scale * input) over the keys with every key after the query masked (those probabilities are 0);
`backward(output_grads, softmax_results, scale)` returns the input's gradient, written into
`output_grads` as apex's kernel did. The maths: apexlite.compat._fused_softmax.
"""
from __future__ import annotations

import torch

from apexlite.compat import _fused_softmax

__all__ = ["forward", "backward"]


def forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Causal softmax(scale_factor * input) over the keys, in the input's dtype."""
    _fused_softmax.check(input, 3, "scaled_upper_triang_masked_softmax_cuda.forward")
    return _fused_softmax.forward(input, scale_factor, causal=True)


def backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """The input's gradient, written into output_grads (in place) and returned."""
    function = "scaled_upper_triang_masked_softmax_cuda.backward"
    _fused_softmax.check(output_grads, 3, function, "output_grads")
    _fused_softmax.check(softmax_results, 3, function, "softmax_results")
    return _fused_softmax.backward_in_place(output_grads, softmax_results, scale_factor)
