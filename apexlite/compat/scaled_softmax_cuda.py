"""`scaled_softmax_cuda`: apex's Megatron softmax of scaled attention scores without a mask.

`forward(input, scale)` returns softmax(scale * input) over the last dimension of a 4D fp16/bf16 tensor
[batches, heads, queries, keys]; `backward(output_grads, softmax_results, scale)` returns the input's
gradient, written into `output_grads` as apex's kernel did. The maths: apexlite.compat._fused_softmax.
"""
from __future__ import annotations

import torch

from apexlite.compat import _fused_softmax

__all__ = ["forward", "backward"]


def forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """softmax(scale_factor * input) over the keys, in the input's dtype."""
    _fused_softmax.check(input, 4, "scaled_softmax_cuda.forward")
    return _fused_softmax.forward(input, scale_factor)


def backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """The input's gradient, written into output_grads (in place) and returned."""
    _fused_softmax.check(output_grads, 4, "scaled_softmax_cuda.backward", "output_grads")
    _fused_softmax.check(softmax_results, 4, "scaled_softmax_cuda.backward", "softmax_results")
    return _fused_softmax.backward_in_place(output_grads, softmax_results, scale_factor)
