"""apex's fused LayerNorm/RMSNorm modules and functions, on torch ops with fp32 math.

Dtype contract (apex's fused kernels): FusedLayerNorm/FusedRMSNorm return the input's dtype;
the Mixed* variants (always affine) return the parameters' dtype, so fp16/bf16 activations can
feed fp32-kept norm weights. Statistics are always computed in fp32. The functional forms follow
apex under torch.autocast: their arguments are cast to the autocast dtype first.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from apexlite._logging import get_logger

log = get_logger("normalization")
Shape = Union[int, Sequence[int], torch.Size]


def _as_shape(normalized_shape: Shape) -> Tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(normalized_shape)


def _float(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.float()


def _layer_norm(x: torch.Tensor, shape: Tuple[int, ...], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    return F.layer_norm(x.float(), shape, _float(weight), _float(bias), eps).to(out_dtype)


def _rms_norm(x: torch.Tensor, shape: Tuple[int, ...], weight: Optional[torch.Tensor], eps: float,
              out_dtype: torch.dtype) -> torch.Tensor:
    dims = tuple(range(-len(shape), 0))
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(out_dtype)


def _autocast_args(*tensors: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
    """Under torch.autocast, cast floating args to the autocast dtype (what apex's functions did)."""
    device = next((t.device.type for t in tensors if t is not None), "cpu")
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors)


def fused_layer_norm_affine(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                            normalized_shape: Shape, eps: float = 1e-6,
                            memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm with weight and bias; output in the input's dtype."""
    input, weight, bias = _autocast_args(input, weight, bias)
    return _layer_norm(input, _as_shape(normalized_shape), weight, bias, eps, input.dtype)


def fused_layer_norm(input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6,
                     memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm without affine parameters; output in the input's dtype."""
    (input,) = _autocast_args(input)
    return _layer_norm(input, _as_shape(normalized_shape), None, None, eps, input.dtype)


def mixed_dtype_fused_layer_norm_affine(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                        normalized_shape: Shape, eps: float = 1e-6,
                                        memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm with weight and bias; output in the weight's dtype."""
    input, weight, bias = _autocast_args(input, weight, bias)
    return _layer_norm(input, _as_shape(normalized_shape), weight, bias, eps, weight.dtype)


def fused_rms_norm_affine(input: torch.Tensor, weight: torch.Tensor, normalized_shape: Shape,
                          eps: float = 1e-6, memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm with a weight; output in the input's dtype."""
    input, weight = _autocast_args(input, weight)
    return _rms_norm(input, _as_shape(normalized_shape), weight, eps, input.dtype)


def fused_rms_norm(input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6,
                   memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm without a weight; output in the input's dtype."""
    (input,) = _autocast_args(input)
    return _rms_norm(input, _as_shape(normalized_shape), None, eps, input.dtype)


def mixed_dtype_fused_rms_norm_affine(input: torch.Tensor, weight: torch.Tensor, normalized_shape: Shape,
                                      eps: float = 1e-6, memory_efficient: bool = False) -> torch.Tensor:
    """RMSNorm with a weight; output in the weight's dtype."""
    input, weight = _autocast_args(input, weight)
    return _rms_norm(input, _as_shape(normalized_shape), weight, eps, weight.dtype)


class FusedLayerNorm(torch.nn.Module):
    """apex.normalization.FusedLayerNorm: torch.nn.LayerNorm's maths, output in the input's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape))
            self.bias = torch.nn.Parameter(torch.zeros(self.normalized_shape))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps, self._out_dtype(input))

    def _out_dtype(self, input: torch.Tensor) -> torch.dtype:
        return input.dtype

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedRMSNorm(torch.nn.Module):
    """apex.normalization.FusedRMSNorm: x / sqrt(mean(x^2) + eps) * weight, output in the input's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _rms_norm(input, self.normalized_shape, self.weight, self.eps, self._out_dtype(input))

    def _out_dtype(self, input: torch.Tensor) -> torch.dtype:
        return input.dtype

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def _check_mixed_affine(cls_name: str, norm: str, kwargs: dict) -> None:
    if "elementwise_affine" in kwargs:
        if not kwargs.pop("elementwise_affine"):
            raise RuntimeError(f"{cls_name} does not support `elementwise_affine = False`; use Fused{norm} "
                               "for a norm without parameters.")
        log.warning("%s does not support `elementwise_affine` argument (it is always affine)", cls_name)
    if kwargs:
        raise TypeError(f"{cls_name} got unexpected arguments {sorted(kwargs)}")


class MixedFusedLayerNorm(FusedLayerNorm):
    """Always-affine FusedLayerNorm whose output takes the parameters' dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: bool) -> None:
        _check_mixed_affine("MixedFusedLayerNorm", "LayerNorm", kwargs)
        super().__init__(normalized_shape, eps, True, memory_efficient)

    def _out_dtype(self, input: torch.Tensor) -> torch.dtype:
        return self.weight.dtype


class MixedFusedRMSNorm(FusedRMSNorm):
    """Always-affine FusedRMSNorm whose output takes the weight's dtype."""

    def __init__(self, normalized_shape: Shape, eps: float = 1e-5, *, memory_efficient: bool = False,
                 **kwargs: bool) -> None:
        _check_mixed_affine("MixedFusedRMSNorm", "RMSNorm", kwargs)
        super().__init__(normalized_shape, eps, True, memory_efficient)

    def _out_dtype(self, input: torch.Tensor) -> torch.dtype:
        return self.weight.dtype
