"""`scaled_masked_softmax_cuda`: apex's Megatron softmax of scaled, masked attention scores.

`forward(input, mask, scale)` takes fp16/bf16 scores [batches, heads, queries, keys] and a uint8/bool
mask [batches or 1, 1, queries, keys] (1 = masked) and returns softmax(scale * input) over the keys, a
masked score counting as -10000 and a row with every score masked coming out zeros;
`backward(output_grads, softmax_results, scale)` returns the input's gradient (a new tensor);
`get_batch_per_block(queries, keys, batches, heads)` is the number of rows one CUDA block of apex's
kernel handles, which Megatron-LM's `is_kernel_available` divides the batch by. The maths:
apexlite.compat._fused_softmax.
"""
from __future__ import annotations

import torch

from apexlite.compat import _fused_softmax

__all__ = ["forward", "backward", "get_batch_per_block"]
_WARP_SIZE = 32  # an NVIDIA warp (apex's C10_WARP_SIZE)
_THREADS_PER_BLOCK = 128


def check_mask(input: torch.Tensor, mask: torch.Tensor, function: str) -> None:
    """apex's mask checks: 4D, [batches or 1, 1, queries, keys]."""
    if mask.dim() != 4:
        raise RuntimeError(f"{function}: expected 4D tensor for mask, got shape {list(mask.shape)}")
    batches, _, queries, keys = input.shape
    if mask.shape[0] not in (1, batches) or tuple(mask.shape[1:]) != (1, queries, keys):
        raise RuntimeError(f"{function}: the mask must have shape [{batches} or 1, 1, {queries}, {keys}] for scores "
                           f"of shape {list(input.shape)}; got {list(mask.shape)}")


def forward(input: torch.Tensor, mask: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """Masked softmax(scale_factor * input) over the keys, in the input's dtype."""
    function = "scaled_masked_softmax_cuda.forward"
    _fused_softmax.check(input, 4, function)
    check_mask(input, mask, function)
    return _fused_softmax.forward(input, scale_factor, mask=mask)


def backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """The input's gradient, a new tensor in the gradient's dtype."""
    _fused_softmax.check(output_grads, 4, "scaled_masked_softmax_cuda.backward", "output_grads")
    _fused_softmax.check(softmax_results, 4, "scaled_masked_softmax_cuda.backward", "softmax_results")
    return _fused_softmax.backward(output_grads, softmax_results, scale_factor)


def get_batch_per_block(query_seq_len: int, key_seq_len: int, batches: int, attn_heads: int) -> int:
    """Rows per CUDA block of apex's kernel: (128 threads / a warp per row) * (2 rows a warp up to 128 keys)."""
    keys_rounded = 1 << max(int(key_seq_len) - 1, 0).bit_length()  # the next power of two >= key_seq_len
    warp_size = min(keys_rounded, _WARP_SIZE)
    batches_per_warp = 2 if keys_rounded <= 128 else 1
    return (_THREADS_PER_BLOCK // warp_size) * batches_per_warp
