"""apex's fused LayerNorm/RMSNorm modules (FusedLayerNorm, FusedRMSNorm and the Mixed* variants).

Their forward is one of the functions of `functions`: FusedLayerNorm/FusedRMSNorm return the input's
dtype; the Mixed* variants (always affine) return the parameters' dtype, so fp16/bf16 activations can
feed fp32-kept norm weights.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from apexlite.normalization.functions import (
    Shape, as_shape, fused_layer_norm, fused_layer_norm_affine, fused_rms_norm, fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine, mixed_dtype_fused_rms_norm_affine,
)


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
        if torch.jit.is_scripting():  # apex's fallback under TorchScript: torch's own op
            return torch.nn.functional.layer_norm(input, list(self.normalized_shape), self.weight, self.bias,
                                                  self.eps)
        return self._fused(input)

    @torch.jit.unused
    def _fused(self, input: torch.Tensor) -> torch.Tensor:
        if self.elementwise_affine:
            return fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                           self.memory_efficient)
        return fused_layer_norm(input, self.normalized_shape, self.eps, self.memory_efficient)


class FusedRMSNorm(_FusedNorm):
    """apex.normalization.FusedRMSNorm: x / sqrt(mean(x^2) + eps) * weight, output in the input's dtype."""

    has_bias = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # apex's fallback under TorchScript: torch's own op
            return torch.nn.functional.rms_norm(input, list(self.normalized_shape), self.weight, self.eps)
        return self._fused(input)

    @torch.jit.unused
    def _fused(self, input: torch.Tensor) -> torch.Tensor:
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

    @torch.jit.unused
    def _fused(self, input: torch.Tensor) -> torch.Tensor:
        return mixed_dtype_fused_layer_norm_affine(input, self.weight, self.bias, self.normalized_shape, self.eps,
                                                   self.memory_efficient)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Always-affine FusedRMSNorm whose output takes the weight's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: Any) -> None:
        _mixed_is_affine("MixedFusedRMSNorm", kwargs)
        super().__init__(normalized_shape, eps, True, memory_efficient)

    @torch.jit.unused
    def _fused(self, input: torch.Tensor) -> torch.Tensor:
        return mixed_dtype_fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps,
                                                 self.memory_efficient)
