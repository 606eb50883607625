"""apex's fused LayerNorm/RMSNorm modules and functions, on torch ops with fp32 statistics, any device.

Dtype contract (apex's fused kernels): FusedLayerNorm/FusedRMSNorm return the input's dtype; the
Mixed* variants (always affine) return the parameters' dtype, so fp16/bf16 activations can feed
fp32-kept norm weights. Statistics are computed in fp32 (float64 inputs in float64). Under
torch.autocast the functions and modules first cast their floating arguments (not float64) to the
autocast dtype, as apex's did, then run with autocast off. The autograd Functions themselves are
in norm_functions.py.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

import torch

from apexlite.norm_functions import (
    FusedLayerNormAffineFunction, FusedLayerNormAffineMixedDtypesFunction, FusedLayerNormFunction,
    FusedRMSNormAffineFunction, FusedRMSNormAffineMixedDtypesFunction, FusedRMSNormFunction, Shape, as_shape,
)

__all__ = [
    "FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm",
    "FusedLayerNormAffineFunction", "FusedLayerNormAffineMixedDtypesFunction", "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction", "FusedRMSNormAffineMixedDtypesFunction", "FusedRMSNormFunction",
    "fused_layer_norm", "fused_layer_norm_affine", "fused_rms_norm", "fused_rms_norm_affine",
    "mixed_dtype_fused_layer_norm_affine", "mixed_dtype_fused_rms_norm_affine",
]


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype active for `device_type`, or None (torch >= 2.4 API, with the older fallback)."""
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except (AttributeError, TypeError):  # torch < 2.4: per-device functions for cuda and cpu only
        if device_type == "cuda":
            return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return None


def cast_if_autocast_enabled(*args: Any) -> Tuple[Any, ...]:
    """Under autocast, floating (non-float64) tensors on the autocast device go to its dtype."""
    device_type = next((arg.device.type for arg in args if isinstance(arg, torch.Tensor)), "cpu")
    dtype = autocast_dtype(device_type)
    if dtype is None:
        return args
    return tuple(arg.to(dtype) if isinstance(arg, torch.Tensor) and arg.is_floating_point()
                 and arg.dtype is not torch.float64 and arg.device.type == device_type else arg for arg in args)


def fused_layer_norm_affine(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                            normalized_shape: Shape, eps: float = 1e-6, memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm with weight and bias; output in the input's dtype."""
    return FusedLayerNormAffineFunction.apply(
        *cast_if_autocast_enabled(input, weight, bias, normalized_shape, eps, memory_efficient))


def fused_layer_norm(input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6,
                     memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm without affine parameters; output in the input's dtype."""
    return FusedLayerNormFunction.apply(*cast_if_autocast_enabled(input, normalized_shape, eps, memory_efficient))


def mixed_dtype_fused_layer_norm_affine(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                        normalized_shape: Shape, eps: float = 1e-6,
                                        memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm with weight and bias; output in the weight's dtype."""
    return FusedLayerNormAffineMixedDtypesFunction.apply(
        *cast_if_autocast_enabled(input, weight, bias, normalized_shape, eps, memory_efficient))


def fused_rms_norm_affine(input: torch.Tensor, weight: torch.Tensor, normalized_shape: Shape,
                          eps: float = 1e-6, memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm with a weight; output in the input's dtype."""
    return FusedRMSNormAffineFunction.apply(
        *cast_if_autocast_enabled(input, weight, normalized_shape, eps, memory_efficient))


def fused_rms_norm(input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6,
                   memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm without a weight; output in the input's dtype."""
    return FusedRMSNormFunction.apply(*cast_if_autocast_enabled(input, normalized_shape, eps, memory_efficient))


def mixed_dtype_fused_rms_norm_affine(input: torch.Tensor, weight: torch.Tensor, normalized_shape: Shape,
                                      eps: float = 1e-6, memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm with a weight; output in the weight's dtype."""
    return FusedRMSNormAffineMixedDtypesFunction.apply(
        *cast_if_autocast_enabled(input, weight, normalized_shape, eps, memory_efficient))


class _FusedNorm(torch.nn.Module):
    """What FusedLayerNorm and FusedRMSNorm share: apex's constructor arguments and attributes."""

    has_bias = True

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__()
        self.normalized_shape = torch.Size(as_shape(normalized_shape))
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape))
            if self.has_bias:
                self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape))
        else:
            self.register_parameter("weight", None)
            if self.has_bias:
                self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones (and bias to zeros)."""
        if self.elementwise_affine:
            torch.nn.init.ones_(self.weight)
            if self.has_bias:
                torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedLayerNorm(_FusedNorm):
    """apex.normalization.FusedLayerNorm: torch.nn.LayerNorm's maths, output in the input's dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.elementwise_affine:
            return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                           self.memory_efficient)
        return fused_layer_norm(input, self.normalized_shape, self.eps, self.memory_efficient)


class FusedRMSNorm(_FusedNorm):
    """apex.normalization.FusedRMSNorm: x / sqrt(mean(x^2) + eps) * weight, output in the input's dtype."""

    has_bias = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.elementwise_affine:
            return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps, self.memory_efficient)
        return fused_rms_norm(input, self.normalized_shape, self.eps, self.memory_efficient)


def _mixed_is_affine(cls_name: str, kwargs: dict) -> None:
    """The Mixed* norms are always affine: `elementwise_affine` warns, and False raises (as in apex)."""
    if "elementwise_affine" in kwargs:
        warnings.warn(f"{cls_name} does not support `elementwise_affine` argument")
        if not kwargs.pop("elementwise_affine"):
            raise RuntimeError(f"{cls_name} does not support `elementwise_affine = False`")
    if kwargs:
        raise TypeError(f"{cls_name}.__init__() got unexpected keyword arguments {sorted(kwargs)}")


class MixedFusedLayerNorm(FusedLayerNorm):
    """Always-affine FusedLayerNorm whose output takes the parameters' dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: Any) -> None:
        _mixed_is_affine("MixedFusedLayerNorm", kwargs)
        super().__init__(normalized_shape, eps, True, memory_efficient)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return mixed_dtype_fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                                   self.memory_efficient)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Always-affine FusedRMSNorm whose output takes the weight's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: Any) -> None:
        _mixed_is_affine("MixedFusedRMSNorm", kwargs)
        super().__init__(normalized_shape, eps, True, memory_efficient)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return mixed_dtype_fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps,
                                                 self.memory_efficient)
