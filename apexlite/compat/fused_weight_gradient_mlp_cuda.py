"""`fused_weight_gradient_mlp_cuda`: apex's weight-gradient GEMMs that accumulate into the gradient buffer.

Megatron-LM's gradient accumulation fusion (`gradient_accumulation_fusion=True`, its default) calls
`wgrad_gemm_accum_fp32(input, grad_output, weight.main_grad)` (or `_fp16` for a 16-bit main_grad) from
the backward of its linear layers: d_weight += grad_output^T @ input, with the leading dimensions of
`input` [..., in] and `grad_output` [..., out] flattened, products summed in fp32 and d_weight [out, in]
rounded once. The `_fp32` variant takes fp32/fp16/bf16 inputs and an fp32 d_weight; the `_fp16` one
fp16/bf16 inputs and a d_weight of their dtype. One matmul in fp32 plus an add, instead of apex's
cuBLAS GEMM with beta = 1.
"""
from __future__ import annotations

import torch

__all__ = ["wgrad_gemm_accum_fp32", "wgrad_gemm_accum_fp16"]


def _accumulate(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor, function: str) -> None:
    input_2d = input.reshape(-1, input.shape[-1])
    d_output_2d = d_output.reshape(-1, d_output.shape[-1])
    expected = (d_output_2d.shape[1], input_2d.shape[1])
    if input_2d.shape[0] != d_output_2d.shape[0] or tuple(d_weight.shape) != expected:
        raise RuntimeError(f"{function}: input {list(input.shape)} and d_output {list(d_output.shape)} need a "
                           f"d_weight of shape {list(expected)} and the same number of rows; got "
                           f"{list(d_weight.shape)}")
    with torch.no_grad():
        product = torch.matmul(d_output_2d.t().float(), input_2d.float())
        d_weight.copy_(d_weight.float().add_(product))


def wgrad_gemm_accum_fp32(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor) -> None:
    """d_weight (fp32) += d_output^T @ input, in place."""
    if d_weight.dtype is not torch.float32:
        raise RuntimeError(f"fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32: d_weight must be float32 (an "
                           f"fp32 main_grad), got {d_weight.dtype}; use wgrad_gemm_accum_fp16 for 16-bit ones")
    if input.dtype not in (torch.float32, torch.float16, torch.bfloat16) or d_output.dtype is not input.dtype:
        raise RuntimeError("fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32: input and d_output must share one "
                           f"of float32/float16/bfloat16; got {input.dtype} and {d_output.dtype}")
    _accumulate(input, d_output, d_weight, "fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32")


def wgrad_gemm_accum_fp16(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor) -> None:
    """d_weight (the inputs' 16-bit dtype) += d_output^T @ input, in place, summed in fp32."""
    if input.dtype not in (torch.float16, torch.bfloat16) or d_output.dtype is not input.dtype \
            or d_weight.dtype is not input.dtype:
        raise RuntimeError("fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16: input, d_output and d_weight must "
                           f"all be float16 or all bfloat16; got {input.dtype}, {d_output.dtype}, {d_weight.dtype}")
    _accumulate(input, d_output, d_weight, "fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp16")
