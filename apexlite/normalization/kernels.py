"""Forward and backward maths of LayerNorm and RMSNorm on torch ops, with the statistics in fp32.

These are what apex's fused_layer_norm_cuda kernels computed, for any device: half and bfloat16
inputs are normalised in fp32 (float64 stays float64), the output takes the dtype the caller asks
for, and `mean`/`invvar` come back flat (one value per normalised row), as apex returned them.
`input_or_output` in the backward is the saved input, or with `memory_efficient` the saved output,
from which the normalised values are recovered (dividing by the weight, its magnitude clamped to at
least eps, as apex's kernels did).

NOTE [no aliased returns]
A dtype conversion that changes nothing is skipped (`as_dtype`), never written as `t.to(dtype)`:
that returns the same tensor under a second name, and torch 2.11's torch.compile, tracing an
autograd.Function whose forward returns such a tensor, routes the backward's incoming gradient to
the wrong output (pytorch#180642): compiled input gradients came out zero on CPU and CUDA alike.
For the same reason the `*WithStats` Functions return copies of the flat statistics, not views of
the tensors they save (2.11 refused those: "element 1 of tensors does not require grad").
tests/normalization/test_compiled_norms.py compares compiled with eager forward and backward.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional, Sequence, Tuple

import torch

Tensor = torch.Tensor


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics are computed in: fp32 for half/bfloat16 inputs, else the input's own."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def autocast_off(device_type: str) -> ContextManager[Any]:
    """No autocast for the block on `device_type` (the maths below chooses its own dtypes). A context object,
    not a generator: torch 2.5's dynamo cannot trace a contextlib.contextmanager."""
    if device_type in ("cpu", "cuda"):
        return torch.autocast(device_type, enabled=False)
    try:
        return torch.autocast(device_type, enabled=False)
    except RuntimeError:  # a device type autocast does not know: nothing to turn off
        return contextlib.nullcontext()


def check_shapes(input: Tensor, shape: Tuple[int, ...], *params: Optional[Tensor]) -> None:
    """Raise a clear error when input's trailing dims or a parameter do not match `normalized_shape`."""
    if tuple(input.shape[input.dim() - len(shape):]) != shape or input.dim() < len(shape):
        raise RuntimeError(f"normalized_shape {list(shape)} does not match the trailing dimensions of the "
                           f"input of shape {list(input.shape)}; pass the sizes of the last dims to normalise.")
    for param in params:
        if param is not None and tuple(param.shape) != shape:
            raise RuntimeError(f"the norm's weight/bias has shape {list(param.shape)} but normalized_shape is "
                               f"{list(shape)}; they must be equal.")


def _dims(shape: Sequence[int]) -> Tuple[int, ...]:
    return tuple(range(-len(shape), 0))


def _rows(input: Tensor, shape: Sequence[int]) -> Tuple[int, ...]:
    """input's leading (not normalised) dims with ones for the normalised ones: how stats broadcast."""
    return tuple(input.shape[:input.dim() - len(shape)]) + (1,) * len(shape)


def as_dtype(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """`t` in `dtype`: the tensor itself when it already is (never a no-op `.to()`, see NOTE [no aliased
    returns]), None for None."""
    if t is None or t.dtype == dtype:
        return t
    return t.to(dtype)


def _clamp_by_magnitude(weight: Tensor, eps: float) -> Tensor:
    """weight with |weight| raised to at least eps, its sign kept (zero counts as positive)."""
    return torch.where(weight >= 0, weight.clamp(min=eps), weight.clamp(max=-eps))


def _sum_to_param(t: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum over the leading (batch) dims, leaving a tensor of the normalised shape."""
    return t.reshape(-1, *shape).sum(0)


def layer_norm_forward(input: Tensor, shape: Tuple[int, ...], weight: Optional[Tensor], bias: Optional[Tensor],
                       eps: float, out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """(output in out_dtype, mean, invvar); mean and invvar flat, in the statistics dtype."""
    compute = stats_dtype(input.dtype)
    with autocast_off(input.device.type):
        output, mean, invvar = torch.native_layer_norm(as_dtype(input, compute), list(shape), as_dtype(weight, compute),
                                                       as_dtype(bias, compute), eps)
    return as_dtype(output, out_dtype), mean.reshape(-1), invvar.reshape(-1)


def layer_norm_backward(grad_output: Tensor, mean: Optional[Tensor], invvar: Tensor, input_or_output: Tensor,
                        shape: Tuple[int, ...], weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                        memory_efficient: bool) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Gradients for (input, weight, bias) in their own dtypes (None for a missing parameter)."""
    compute = stats_dtype(input_or_output.dtype)
    rows = _rows(input_or_output, shape)
    grad = as_dtype(grad_output, compute)
    weight_c, bias_c = as_dtype(weight, compute), as_dtype(bias, compute)
    with autocast_off(input_or_output.device.type):
        if memory_efficient:
            grads = _layer_norm_backward_from_output(grad, invvar.reshape(rows), as_dtype(input_or_output, compute),
                                                     shape, weight_c, bias_c, eps)
        else:
            mask = [True, weight is not None, bias is not None]
            grads = torch.ops.aten.native_layer_norm_backward(
                grad, as_dtype(input_or_output, compute), list(shape), mean.reshape(rows), invvar.reshape(rows),
                weight_c, bias_c, mask)
    grad_input, grad_weight, grad_bias = grads
    return (as_dtype(grad_input, input_or_output.dtype), as_dtype(grad_weight, weight.dtype) if weight is not None else None,
            as_dtype(grad_bias, bias.dtype) if bias is not None else None)


def _layer_norm_backward_from_output(grad: Tensor, invvar: Tensor, output: Tensor, shape: Tuple[int, ...],
                                     weight: Optional[Tensor], bias: Optional[Tensor], eps: float):
    dims, count = _dims(shape), float(torch.Size(shape).numel())
    if weight is None:
        normed, grad_normed, weighted = output, grad, grad * output
    else:
        shifted = output - bias
        normed = shifted / _clamp_by_magnitude(weight, eps)
        grad_normed, weighted = grad * weight, grad * shifted
    sum_grad = grad_normed.sum(dims, keepdim=True)
    sum_weighted = weighted.sum(dims, keepdim=True)
    grad_input = (invvar / count) * (count * grad_normed - sum_grad - normed * sum_weighted)
    if weight is None:
        return grad_input, None, None
    return grad_input, _sum_to_param(grad * normed, shape), _sum_to_param(grad, shape)


def rms_norm_forward(input: Tensor, shape: Tuple[int, ...], weight: Optional[Tensor], eps: float,
                     out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(output in out_dtype, invvar); invvar = 1/sqrt(mean(x^2) + eps), flat, in the statistics dtype."""
    compute = stats_dtype(input.dtype)
    with autocast_off(input.device.type):
        x = as_dtype(input, compute)
        invvar = torch.rsqrt(x.square().mean(_dims(shape), keepdim=True) + eps)
        output = x * invvar
        if weight is not None:
            output = output * as_dtype(weight, compute)
    return as_dtype(output, out_dtype), invvar.reshape(-1)


def rms_norm_backward(grad_output: Tensor, invvar: Tensor, input_or_output: Tensor, shape: Tuple[int, ...],
                      weight: Optional[Tensor], eps: float, memory_efficient: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Gradients for (input, weight) in their own dtypes (None without a weight)."""
    compute = stats_dtype(input_or_output.dtype)
    dims, count = _dims(shape), float(torch.Size(shape).numel())
    with autocast_off(input_or_output.device.type):
        invvar = invvar.reshape(_rows(input_or_output, shape))
        grad = as_dtype(grad_output, compute)
        saved = as_dtype(input_or_output, compute)
        weight_c = as_dtype(weight, compute)
        if memory_efficient:
            normed = saved if weight is None else saved / _clamp_by_magnitude(weight_c, eps)
            sum_weighted = (grad * saved).sum(dims, keepdim=True)
        else:
            normed = saved * invvar
            sum_weighted = (grad * normed * (1.0 if weight is None else weight_c)).sum(dims, keepdim=True)
        grad_normed = grad if weight is None else grad * weight_c
        grad_input = (invvar / count) * (count * grad_normed - normed * sum_weighted)
        grad_weight = None if weight is None else as_dtype(_sum_to_param(grad * normed, shape), weight.dtype)
    return as_dtype(grad_input, input_or_output.dtype), grad_weight
