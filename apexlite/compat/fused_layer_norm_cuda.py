"""`fused_layer_norm_cuda`: apex's LayerNorm/RMSNorm extension module, on apexlite.normalization's kernels.

Code written against apex calls these directly (Megatron-LM's fused layer norm imports the module with
`importlib.import_module("fused_layer_norm_cuda")` and calls `forward_affine` / `backward_affine` from
its own autograd Function). Every function takes apex's arguments in apex's order and returns what
apex's returned: a list `[output, mean, invvar]` (RMSNorm: `[output, invvar]`) from the forwards, with
`mean`/`invvar` flat (one value per normalised row) in fp32 for half/bfloat16 inputs; the gradients in
the dtypes of the tensors they belong to from the backwards. The output takes the input's dtype, or
the weight's in the `*_mixed_dtypes` forwards.

As apex's extension did, the functions record no autograd graph (they are the insides of an autograd
Function) and ignore torch.autocast. `memory_efficient` (the saved tensor is the forward's output, and
`mean` may be None) defaults to False, so both apex's current signature and the older one without it
(Megatron-LM 2022-23 calls the backwards with eight arguments) work. Unlike apex's CUDA-only kernels these
run on any device, on non-contiguous tensors, and with a weight whose dtype differs from the input's.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from apexlite.normalization import kernels
from apexlite.normalization.functions import as_shape

Tensor = torch.Tensor

__all__ = [
    "forward_affine", "forward", "backward_affine", "backward", "forward_affine_mixed_dtypes",
    "rms_forward_affine", "rms_forward", "rms_backward_affine", "rms_backward", "rms_forward_affine_mixed_dtypes",
]


def _layer_norm(input: Tensor, normalized_shape: Sequence[int], gamma: Optional[Tensor], beta: Optional[Tensor],
                epsilon: float, out_dtype: torch.dtype) -> List[Tensor]:
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input, shape, gamma, beta)
    with torch.no_grad():
        return list(kernels.layer_norm_forward(input, shape, gamma, beta, epsilon, out_dtype))


def _rms_norm(input: Tensor, normalized_shape: Sequence[int], gamma: Optional[Tensor], epsilon: float,
              out_dtype: torch.dtype) -> List[Tensor]:
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input, shape, gamma)
    with torch.no_grad():
        return list(kernels.rms_norm_forward(input, shape, gamma, epsilon, out_dtype))


def forward_affine(input: Tensor, normalized_shape: Sequence[int], gamma: Tensor, beta: Tensor,
                   epsilon: float) -> List[Tensor]:
    """[output (input's dtype), mean, invvar] of LayerNorm with weight `gamma` and bias `beta`."""
    return _layer_norm(input, normalized_shape, gamma, beta, epsilon, input.dtype)


def forward(input: Tensor, normalized_shape: Sequence[int], epsilon: float) -> List[Tensor]:
    """[output, mean, invvar] of LayerNorm without parameters."""
    return _layer_norm(input, normalized_shape, None, None, epsilon, input.dtype)


def forward_affine_mixed_dtypes(input: Tensor, normalized_shape: Sequence[int], gamma: Tensor, beta: Tensor,
                                epsilon: float) -> List[Tensor]:
    """[output (gamma's dtype), mean, invvar] of LayerNorm: fp16/bf16 activations with fp32 parameters."""
    return _layer_norm(input, normalized_shape, gamma, beta, epsilon, gamma.dtype)


def _saved_mean(mean: Optional[Tensor], memory_efficient: bool, function: str) -> Optional[Tensor]:
    if mean is None and not memory_efficient:
        raise ValueError(f"fused_layer_norm_cuda.{function}: mean is None, which only memory_efficient=True "
                         "allows (the output is saved then); pass the mean the forward returned.")
    return mean


def backward_affine(dout: Tensor, mean: Optional[Tensor], invvar: Tensor, input_or_output: Tensor,
                    normalized_shape: Sequence[int], gamma: Tensor, beta: Tensor, epsilon: float,
                    memory_efficient: bool = False) -> List[Tensor]:
    """[grad_input, grad_gamma, grad_beta] of forward_affine; `input_or_output` is the forward's input,
    or its output with memory_efficient."""
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input_or_output, shape, gamma, beta)
    mean = _saved_mean(mean, memory_efficient, "backward_affine")
    with torch.no_grad():
        return list(kernels.layer_norm_backward(dout, mean, invvar, input_or_output, shape, gamma, beta, epsilon,
                                                bool(memory_efficient)))


def backward(dout: Tensor, mean: Optional[Tensor], invvar: Tensor, input_or_output: Tensor,
             normalized_shape: Sequence[int], epsilon: float, memory_efficient: bool = False) -> Tensor:
    """grad_input of forward."""
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input_or_output, shape)
    mean = _saved_mean(mean, memory_efficient, "backward")
    with torch.no_grad():
        return kernels.layer_norm_backward(dout, mean, invvar, input_or_output, shape, None, None, epsilon,
                                           bool(memory_efficient))[0]


def rms_forward_affine(input: Tensor, normalized_shape: Sequence[int], gamma: Tensor, epsilon: float) -> List[Tensor]:
    """[output (input's dtype), invvar] of RMSNorm with weight `gamma`."""
    return _rms_norm(input, normalized_shape, gamma, epsilon, input.dtype)


def rms_forward(input: Tensor, normalized_shape: Sequence[int], epsilon: float) -> List[Tensor]:
    """[output, invvar] of RMSNorm without a weight."""
    return _rms_norm(input, normalized_shape, None, epsilon, input.dtype)


def rms_forward_affine_mixed_dtypes(input: Tensor, normalized_shape: Sequence[int], gamma: Tensor,
                                    epsilon: float) -> List[Tensor]:
    """[output (gamma's dtype), invvar] of RMSNorm."""
    return _rms_norm(input, normalized_shape, gamma, epsilon, gamma.dtype)


def rms_backward_affine(dout: Tensor, invvar: Tensor, input_or_output: Tensor, normalized_shape: Sequence[int],
                        gamma: Tensor, epsilon: float, memory_efficient: bool = False) -> List[Tensor]:
    """[grad_input, grad_gamma] of rms_forward_affine."""
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input_or_output, shape, gamma)
    with torch.no_grad():
        return list(kernels.rms_norm_backward(dout, invvar, input_or_output, shape, gamma, epsilon,
                                              bool(memory_efficient)))


def rms_backward(dout: Tensor, invvar: Tensor, input_or_output: Tensor, normalized_shape: Sequence[int],
                 epsilon: float, memory_efficient: bool = False) -> Tensor:
    """grad_input of rms_forward."""
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input_or_output, shape)
    with torch.no_grad():
        return kernels.rms_norm_backward(dout, invvar, input_or_output, shape, None, epsilon,
                                         bool(memory_efficient))[0]
