"""`apex.normalization.fused_layer_norm`: apex's module of that name, on apexlite.normalization.

Besides the modules, functions and autograd Functions, apex defined operator-style functions
(`fused_layer_norm_affine_fwd` returning output, mean and invvar; `*_bwd` returning the gradients;
`*_fake` giving empty results of the right shapes) and `manual_rms_norm`, its unfused reference.
They are provided here with apex's signatures; the forward ones are differentiable in their output.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from apexlite.normalization import kernels
from apexlite.normalization.functions import LayerNormWithStatsFunction, RMSNormWithStatsFunction, as_shape
from apexlite.normalization import (  # noqa: F401  (apex's names)
    FusedLayerNorm, FusedLayerNormAffineFunction, FusedLayerNormAffineMixedDtypesFunction, FusedLayerNormFunction,
    FusedRMSNorm, FusedRMSNormAffineFunction, FusedRMSNormAffineMixedDtypesFunction, FusedRMSNormFunction,
    MixedFusedLayerNorm, MixedFusedRMSNorm, fused_layer_norm, fused_layer_norm_affine, fused_rms_norm,
    fused_rms_norm_affine, mixed_dtype_fused_layer_norm_affine, mixed_dtype_fused_rms_norm_affine,
)

Tensor = torch.Tensor
# apex loaded its CUDA extension into this global on first use; apexlite needs none, so it stays None.
fused_layer_norm_cuda = None


def supports_custom_op() -> bool:
    """True: the `*_fwd`/`*_bwd` operator functions below exist on every torch apexlite supports."""
    return True


def manual_rms_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor], eps: float) -> Tensor:
    """apex's unfused RMSNorm: fp32 mean square; a half/bfloat16 weight brings the result to its dtype."""
    dims = tuple(range(-len(normalized_shape), 0))
    mean_square = input.to(torch.float32).square().mean(dims, keepdim=True)
    normed = input * torch.rsqrt(mean_square + eps)
    if weight is None:
        return normed
    if weight.dtype in (torch.float16, torch.bfloat16):
        normed = normed.to(weight.dtype)
    return weight * normed


# --- operator-style forwards (differentiable in the output) -----------------------------------------
def fused_layer_norm_affine_fwd(input: Tensor, weight: Tensor, bias: Tensor, normalized_shape: List[int], eps: float,
                                memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """(output, mean, invvar) of an affine LayerNorm; mean/invvar flat, fp32 for half inputs."""
    return LayerNormWithStatsFunction.apply(input, weight, bias, normalized_shape, eps, memory_efficient)


def fused_layer_norm_fwd(input: Tensor, normalized_shape: List[int], eps: float,
                         memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """(output, mean, invvar) of a LayerNorm without parameters."""
    return LayerNormWithStatsFunction.apply(input, None, None, normalized_shape, eps, memory_efficient)


def fused_rms_norm_affine_fwd(input: Tensor, weight: Tensor, normalized_shape: List[int], eps: float,
                              memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """(output, invvar) of an RMSNorm with a weight."""
    return RMSNormWithStatsFunction.apply(input, weight, normalized_shape, eps, memory_efficient)


def fused_rms_norm_fwd(input: Tensor, normalized_shape: List[int], eps: float,
                       memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """(output, invvar) of an RMSNorm without a weight."""
    return RMSNormWithStatsFunction.apply(input, None, normalized_shape, eps, memory_efficient)


# --- operator-style backwards -------------------------------------------------------------------------
def fused_layer_norm_affine_bwd(grad_output: Tensor, mean: Tensor, invvar: Tensor, input_or_output: Tensor,
                                normalized_shape: List[int], weight: Tensor, bias: Tensor, eps: float,
                                memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """(grad_input, grad_weight, grad_bias) from the forward's statistics and saved input (or output)."""
    return kernels.layer_norm_backward(grad_output, mean, invvar, input_or_output, as_shape(normalized_shape),
                                         weight, bias, eps, memory_efficient)


def fused_layer_norm_bwd(grad_output: Tensor, mean: Tensor, invvar: Tensor, input_or_output: Tensor,
                         normalized_shape: List[int], eps: float, memory_efficient: bool = False) -> Tensor:
    """grad_input of a LayerNorm without parameters."""
    return kernels.layer_norm_backward(grad_output, mean, invvar, input_or_output, as_shape(normalized_shape),
                                         None, None, eps, memory_efficient)[0]


def fused_rms_norm_affine_bwd(grad_output: Tensor, invvar: Tensor, input_or_output: Tensor,
                              normalized_shape: List[int], weight: Tensor, eps: float,
                              memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """(grad_input, grad_weight) of an RMSNorm with a weight."""
    return kernels.rms_norm_backward(grad_output, invvar, input_or_output, as_shape(normalized_shape), weight,
                                       eps, memory_efficient)


def fused_rms_norm_bwd(grad_output: Tensor, invvar: Tensor, input_or_output: Tensor, normalized_shape: List[int],
                       eps: float, memory_efficient: bool = False) -> Tensor:
    """grad_input of an RMSNorm without a weight."""
    return kernels.rms_norm_backward(grad_output, invvar, input_or_output, as_shape(normalized_shape), None,
                                       eps, memory_efficient)[0]


# --- shape functions (empty results with the shapes and dtypes of the real ones) ---------------------
def _empty_stats(input: Tensor, normalized_shape: List[int]) -> Tensor:
    rows = input.numel() // max(torch.Size(as_shape(normalized_shape)).numel(), 1)
    return torch.empty([rows], dtype=kernels.stats_dtype(input.dtype), device=input.device)


def fused_layer_norm_affine_fwd_fake(input: Tensor, weight: Tensor, bias: Tensor, normalized_shape: List[int],
                                     eps: float, memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Empty (output, mean, invvar) shaped as fused_layer_norm_affine_fwd's."""
    return torch.empty_like(input), _empty_stats(input, normalized_shape), _empty_stats(input, normalized_shape)


def fused_layer_norm_fwd_fake(input: Tensor, normalized_shape: List[int], eps: float,
                              memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Empty (output, mean, invvar) shaped as fused_layer_norm_fwd's."""
    return torch.empty_like(input), _empty_stats(input, normalized_shape), _empty_stats(input, normalized_shape)


def fused_rms_norm_affine_fwd_fake(input: Tensor, weight: Tensor, normalized_shape: List[int], eps: float,
                                   memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """Empty (output, invvar) shaped as fused_rms_norm_affine_fwd's."""
    return torch.empty_like(input), _empty_stats(input, normalized_shape)


def fused_rms_norm_fwd_fake(input: Tensor, normalized_shape: List[int], eps: float,
                            memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """Empty (output, invvar) shaped as fused_rms_norm_fwd's."""
    return torch.empty_like(input), _empty_stats(input, normalized_shape)


def fused_layer_norm_affine_bwd_fake(grad_output: Tensor, mean: Tensor, invvar: Tensor, input_or_output: Tensor,
                                     normalized_shape: List[int], weight: Tensor, bias: Tensor, eps: float,
                                     memory_efficient: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Empty gradients shaped as fused_layer_norm_affine_bwd's."""
    return torch.empty_like(input_or_output), torch.empty_like(weight), torch.empty_like(bias)


def fused_layer_norm_bwd_fake(grad_output: Tensor, mean: Tensor, invvar: Tensor, input_or_output: Tensor,
                              normalized_shape: List[int], eps: float, memory_efficient: bool = False) -> Tensor:
    """An empty grad_input shaped as fused_layer_norm_bwd's."""
    return torch.empty_like(input_or_output)


def fused_rms_norm_affine_bwd_fake(grad_output: Tensor, invvar: Tensor, input_or_output: Tensor,
                                   normalized_shape: List[int], weight: Tensor, eps: float,
                                   memory_efficient: bool = False) -> Tuple[Tensor, Tensor]:
    """Empty gradients shaped as fused_rms_norm_affine_bwd's."""
    return torch.empty_like(input_or_output), torch.empty_like(weight)


def fused_rms_norm_bwd_fake(grad_output: Tensor, invvar: Tensor, input_or_output: Tensor,
                            normalized_shape: List[int], eps: float, memory_efficient: bool = False) -> Tensor:
    """An empty grad_input shaped as fused_rms_norm_bwd's."""
    return torch.empty_like(input_or_output)
