"""`generic_scaled_masked_softmax_cuda`: apex's Megatron masked softmax for any number of keys.

As `scaled_masked_softmax_cuda` (forward(input, mask, scale) over fp16/bf16 scores [batches, heads,
queries, keys] with a [batches or 1, 1, queries, keys] mask; backward returns a new tensor), with apex's
generic kernel's test for a fully masked row: its largest score below -10000 + 0.1. The maths:
apexlite.compat._fused_softmax.
"""
from __future__ import annotations

import torch

from apexlite.compat import _fused_softmax
from apexlite.compat.scaled_masked_softmax_cuda import check_mask

__all__ = ["forward", "backward"]


def forward(input: torch.Tensor, mask: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Masked softmax(scale_factor * input) over the keys, in the input's dtype."""
    function = "generic_scaled_masked_softmax_cuda.forward"
    _fused_softmax.check(input, 4, function)
    check_mask(input, mask, function)
    return _fused_softmax.forward(input, scale_factor, mask=mask, generic=True)


def backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """The input's gradient, a new tensor in the gradient's dtype."""
    function = "generic_scaled_masked_softmax_cuda.backward"
    _fused_softmax.check(output_grads, 4, function, "output_grads")
    _fused_softmax.check(softmax_results, 4, function, "softmax_results")
    return _fused_softmax.backward(output_grads, softmax_results, scale_factor)
