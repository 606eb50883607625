"""apex's fused LayerNorm/RMSNorm autograd Functions and the functions that call them, on the torch-op
maths of `kernels`.

Each Function takes apex's forward arguments in apex's order and is used through `.apply`, as
libraries written against apex call them. The `*Affine*` ones take a weight (and LayerNorm a bias)
and return the input's dtype; the `*MixedDtypes*` ones return the weight's dtype. With
`memory_efficient` the output is saved for the backward instead of the input (apex's trade: less
memory, the normalised values recovered from the output). The `*WithStats` Functions also return
the flat statistics, for apex's `*_fwd` operator functions.

The functions (`fused_layer_norm_affine`, ...) are apex's functional API: under torch.autocast they
first cast their floating arguments (not float64) to the autocast dtype, as apex's did, then run the
Function with autocast off.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Tuple, Union

import torch

from apexlite.normalization import kernels

Shape = Union[int, Sequence[int], torch.Size]


def as_shape(normalized_shape: Shape) -> Tuple[int, ...]:
    """normalized_shape as a tuple of ints (an int means the last dim)."""
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    if isinstance(normalized_shape, torch.Size) or (isinstance(normalized_shape, (list, tuple)) and all(
            isinstance(size, numbers.Integral) for size in normalized_shape)):
        return tuple(int(size) for size in normalized_shape)
    raise TypeError(f"normalized_shape must be an int or a sequence of ints (the trailing dims to normalize, e.g. "
                    f"768 or (768,)); got {normalized_shape!r}.")


# --- LayerNorm -------------------------------------------------------------------------------------
def _layer_norm_forward(ctx: Any, input: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                        normalized_shape: Shape, eps: float, memory_efficient: bool,
                        out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input, shape, weight, bias)
    output, mean, invvar = kernels.layer_norm_forward(input, shape, weight, bias, eps, out_dtype)
    ctx.normalized_shape, ctx.eps, ctx.memory_efficient = shape, eps, bool(memory_efficient)
    ctx.input_dtype = input.dtype
    if memory_efficient:
        ctx.save_for_backward(output, weight, bias, None, invvar)
    else:
        ctx.save_for_backward(input, weight, bias, mean, invvar)
    return output, mean, invvar


def _layer_norm_grads(ctx: Any, grad_output: torch.Tensor):
    input_or_output, weight, bias, mean, invvar = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = kernels.layer_norm_backward(
        grad_output, mean, invvar, input_or_output, ctx.normalized_shape, weight, bias, ctx.eps,
        ctx.memory_efficient)
    return kernels.as_dtype(grad_input, ctx.input_dtype), grad_weight, grad_bias


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """LayerNorm with weight and bias; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient, input.dtype)[0]

    @staticmethod
    def backward(ctx, grad_output):
        return (*_layer_norm_grads(ctx, grad_output), None, None, None)


class FusedLayerNormAffineMixedDtypesFunction(FusedLayerNormAffineFunction):
    """LayerNorm with weight and bias; output in the weight's dtype (fp16 input, fp32 parameters)."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient, weight.dtype)[0]


class FusedLayerNormFunction(torch.autograd.Function):
    """LayerNorm without parameters; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _layer_norm_forward(ctx, input, None, None, normalized_shape, eps, memory_efficient, input.dtype)[0]

    @staticmethod
    def backward(ctx, grad_output):
        return _layer_norm_grads(ctx, grad_output)[0], None, None, None


class LayerNormWithStatsFunction(torch.autograd.Function):
    """(output, mean, invvar) of a LayerNorm (weight and bias may be None); differentiable in output."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        output, mean, invvar = _layer_norm_forward(ctx, input, weight, bias, normalized_shape, eps,
                                                   memory_efficient, input.dtype)
        mean, invvar = mean.clone(), invvar.clone()  # not views of saved tensors: NOTE [no aliased returns]
        ctx.mark_non_differentiable(mean, invvar)
        return output, mean, invvar

    @staticmethod
    def backward(ctx, grad_output, grad_mean, grad_invvar):
        return (*_layer_norm_grads(ctx, grad_output), None, None, None)


# --- RMSNorm ---------------------------------------------------------------------------------------
def _rms_norm_forward(ctx: Any, input: torch.Tensor, weight: Optional[torch.Tensor], normalized_shape: Shape,
                      eps: float, memory_efficient: bool, out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    shape = as_shape(normalized_shape)
    kernels.check_shapes(input, shape, weight)
    output, invvar = kernels.rms_norm_forward(input, shape, weight, eps, out_dtype)
    ctx.normalized_shape, ctx.eps, ctx.memory_efficient = shape, eps, bool(memory_efficient)
    ctx.input_dtype = input.dtype
    ctx.save_for_backward(output if memory_efficient else input, weight, invvar)
    return output, invvar


def _rms_norm_grads(ctx: Any, grad_output: torch.Tensor):
    input_or_output, weight, invvar = ctx.saved_tensors
    grad_input, grad_weight = kernels.rms_norm_backward(grad_output, invvar, input_or_output, ctx.normalized_shape,
                                                          weight, ctx.eps, ctx.memory_efficient)
    return kernels.as_dtype(grad_input, ctx.input_dtype), grad_weight


class FusedRMSNormAffineFunction(torch.autograd.Function):
    """RMSNorm with a weight; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, weight, normalized_shape, eps, memory_efficient, input.dtype)[0]

    @staticmethod
    def backward(ctx, grad_output):
        return (*_rms_norm_grads(ctx, grad_output), None, None, None)


class FusedRMSNormAffineMixedDtypesFunction(FusedRMSNormAffineFunction):
    """RMSNorm with a weight; output in the weight's dtype."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, weight, normalized_shape, eps, memory_efficient, weight.dtype)[0]


class FusedRMSNormFunction(torch.autograd.Function):
    """RMSNorm without a weight; output in the input's dtype."""

    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _rms_norm_forward(ctx, input, None, normalized_shape, eps, memory_efficient, input.dtype)[0]

    @staticmethod
    def backward(ctx, grad_output):
        return _rms_norm_grads(ctx, grad_output)[0], None, None, None


class RMSNormWithStatsFunction(torch.autograd.Function):
    """(output, invvar) of an RMSNorm (weight may be None); differentiable in output."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        output, invvar = _rms_norm_forward(ctx, input, weight, normalized_shape, eps, memory_efficient, input.dtype)
        invvar = invvar.clone()  # not a view of a saved tensor: NOTE [no aliased returns] in kernels.py
        ctx.mark_non_differentiable(invvar)
        return output, invvar

    @staticmethod
    def backward(ctx, grad_output, grad_invvar):
        return (*_rms_norm_grads(ctx, grad_output), None, None, None)


# --- the functional API ---------------------------------------------------------------------------
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
    device_type = "cpu"
    for arg in args:  # a plain loop: torch 2.5's dynamo cannot trace next() with a default
        if isinstance(arg, torch.Tensor):
            device_type = arg.device.type
            break
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
