"""The maths behind apex's Megatron softmax extensions (`scaled_softmax_cuda`, `scaled_masked_softmax_cuda`,
`generic_scaled_masked_softmax_cuda`, `scaled_upper_triang_masked_softmax_cuda`), on torch ops.

Forward: softmax over the last dimension of `scale * input`, in fp32, the result in the input's dtype
(fp16 or bf16 only, as apex's kernels took). `scale` is first rounded to the input's dtype, as apex's
kernels received it. A mask (uint8 or bool, 1 = masked) replaces a score by -10000 (not by -inf, so a
partly masked row still normalises over its unmasked scores); a row whose every score is masked comes
out all zeros. The causal variant masks the scores above the diagonal (they come out 0).
Backward: scale * y * (dy - sum(dy * y)), in fp32, from the forward's output y.
No autograd graph is recorded, as in apex's extensions.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor
MASKED_SCORE = -10000.0
HALF_DTYPES = (torch.float16, torch.bfloat16)


def check(tensor: Tensor, dims: int, function: str, what: str = "input") -> None:
    """apex's argument checks: `dims` dimensions, fp16 or bf16."""
    if tensor.dim() != dims:
        raise RuntimeError(f"{function}: expected {dims}D tensor for {what}, got shape {list(tensor.shape)}")
    if tensor.dtype not in HALF_DTYPES:
        raise RuntimeError(f"{function}: Only fp16 and bf16 are supported (got {tensor.dtype} for {what})")


def _rounded(scale: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(float(scale), dtype=dtype))


def forward(input: Tensor, scale: float, mask: Optional[Tensor] = None, causal: bool = False,
            generic: bool = False) -> Tensor:
    """softmax(scale * input) over the last dim, masked as the module docstring says.

    With a mask, a row comes out zeros when its largest score is -10000 (every score masked, or none
    above a masked one), or with `generic` (apex's generic kernel's test) below -10000 + 0.1."""
    with torch.no_grad():
        scores = input.float() * _rounded(scale, input.dtype)
        if causal:
            rows, columns = scores.shape[-2:]
            above = torch.ones(rows, columns, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(above, float("-inf"))
        if mask is None:
            return torch.softmax(scores, dim=-1).to(input.dtype)
        scores = scores.masked_fill(mask.to(scores.device) == 1, MASKED_SCORE)
        probabilities = torch.softmax(scores, dim=-1)
        largest = scores.amax(dim=-1, keepdim=True)
        all_masked = largest < MASKED_SCORE + 0.1 if generic else largest == MASKED_SCORE
        return probabilities.masked_fill(all_masked, 0.0).to(input.dtype)


def backward(output_grads: Tensor, softmax_results: Tensor, scale: float) -> Tensor:
    """scale * y * (dy - sum(dy * y)) over the last dim, in fp32, in the gradient's dtype."""
    with torch.no_grad():
        y, dy = softmax_results.float(), output_grads.float()
        weighted = dy * y
        grad = float(scale) * (weighted - y * weighted.sum(dim=-1, keepdim=True))
        return grad.to(output_grads.dtype)


def backward_in_place(output_grads: Tensor, softmax_results: Tensor, scale: float) -> Tensor:
    """backward, written into `output_grads` and returned, as apex's in-place kernels did (into a contiguous
    copy when `output_grads` is not contiguous)."""
    grad = backward(output_grads, softmax_results, scale)
    if not output_grads.is_contiguous():
        return grad
    with torch.no_grad():
        return output_grads.copy_(grad)
