"""apex's scale, axpby and L2-norm kernels, on torch foreach ops.

All compute in float32 and write outputs in the outputs' dtypes. They never skip on a raised
``noop_flag`` (apex's kernels of this family propagate inf/NaN instead) and set it to 1 when they
meet inf/NaN, still computing every output.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from apexlite.optimizers.multi_tensor._lists import Lists, check_lists, raise_flag_if_non_finite

NormPair = Tuple[torch.Tensor, torch.Tensor]


def _flag_non_finite(noop_flag: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Set noop_flag to 1 when any tensor holds inf/NaN (device-side, no host sync)."""
    norms = torch._foreach_norm([t.float() for t in tensors], float("inf"))
    raise_flag_if_non_finite(noop_flag, torch.stack(norms))


def norms_of(tensors: Sequence[torch.Tensor], per_tensor: Optional[bool]) -> NormPair:
    """(total L2 norm of shape (1,), per-tensor norms of shape (n,) or (0,)), float32, as apex returns them."""
    norms = torch.stack(torch._foreach_norm([t.float() for t in tensors], 2.0))
    total = norms.norm(2).reshape(1)
    return total, (norms if per_tensor else torch.empty(0, dtype=torch.float32, device=total.device))


@torch.no_grad()
def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, scale: float) -> None:
    """out[i] = float(in[i]) * scale, written in out[i]'s dtype."""
    inputs, outputs = check_lists(tensor_lists, (2,), "multi_tensor_scale")
    _flag_non_finite(noop_flag, inputs)
    scaled = torch._foreach_mul([t.float() for t in inputs], float(scale))
    for out, value in zip(outputs, scaled):
        out.copy_(value.view_as(out))


@torch.no_grad()
def multi_tensor_axpby(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, a: float, b: float,
                       arg_to_check: int) -> None:
    """out[i] = a*x[i] + b*y[i]; inf/NaN is checked in x (0), y (1) or both (-1)."""
    xs, ys, outs = check_lists(tensor_lists, (3,), "multi_tensor_axpby")
    checked = {0: xs, 1: ys, -1: xs + ys}.get(arg_to_check)
    if checked is None:
        raise ValueError(f"multi_tensor_axpby: arg_to_check must be -1, 0 or 1; got {arg_to_check}.")
    _flag_non_finite(noop_flag, checked)
    for x, y, out in zip(xs, ys, outs):
        out.copy_((a * x.float() + b * y.float()).view_as(out))


@torch.no_grad()
def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                        per_tensor: Optional[bool] = False) -> NormPair:
    """(total L2 norm, per-tensor norms), as apex returned them: fp32 tensors on the tensors' device,
    the total of shape (1,), the per-tensor norms of shape (len(tensors),), or (0,) unless `per_tensor`."""
    (tensors,) = check_lists(tensor_lists, (1,), "multi_tensor_l2norm")
    _flag_non_finite(noop_flag, tensors)
    return norms_of(tensors, per_tensor)


@torch.no_grad()
def multi_tensor_l2norm_mp(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                           per_tensor: Optional[bool] = False) -> NormPair:
    """multi_tensor_l2norm for the mixed-precision LAMB (fp16/bf16/fp32 inputs, float32 norms).

    apex's variant leaves its outputs unwritten when ``noop_flag`` is already raised; here they are
    always the norms, and the flag is only ever raised, as apex does.
    """
    (tensors,) = check_lists(tensor_lists, (1,), "multi_tensor_l2norm_mp")
    _flag_non_finite(noop_flag, tensors)
    return norms_of(tensors, per_tensor)


@torch.no_grad()
def multi_tensor_l2norm_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, scale: float,
                              per_tensor: Optional[bool] = False) -> NormPair:
    """out[i] = in[i] * scale (in out's dtype), and the L2 norms of the inputs as they came (unscaled)."""
    inputs, outputs = check_lists(tensor_lists, (2,), "multi_tensor_l2norm_scale")
    _flag_non_finite(noop_flag, inputs)
    result = norms_of(inputs, per_tensor)
    scaled = torch._foreach_mul([t.float() for t in inputs], float(scale))
    for out, value in zip(outputs, scaled):
        out.copy_(value.view_as(out))
    return result


@torch.no_grad()
def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                                inv_scale: torch.Tensor, per_tensor: Optional[bool] = False) -> NormPair:
    """The L2 norm of the tensors multiplied by `inv_scale` (the tensors themselves are unchanged)."""
    (tensors,) = check_lists(tensor_lists, (1,), "multi_tensor_unscale_l2norm")
    scaled = [t.float() * inv_scale for t in tensors]
    _flag_non_finite(noop_flag, scaled)
    return norms_of(scaled, per_tensor)


def blend_norms(grads: List[torch.Tensor], norms: torch.Tensor, beta2: float, norm_type: int) -> None:
    """NovoGrad's per-tensor second moment, updated in place in the float32 tensor ``norms``.

    L2 (norm_type 2): n = sqrt(beta2*n**2 + (1-beta2)*||g||**2); max-abs (norm_type 0):
    n = beta2*n + (1-beta2)*max|g|.
    """
    if norm_type == 2:
        fresh = torch.stack(torch._foreach_norm([g.float() for g in grads], 2.0)).to(norms.device)
        norms.copy_((beta2 * norms * norms + (1 - beta2) * fresh * fresh).sqrt())
    elif norm_type == 0:
        fresh = torch.stack(torch._foreach_norm([g.float() for g in grads], float("inf"))).to(norms.device)
        norms.copy_(beta2 * norms + (1 - beta2) * fresh)
    else:
        raise ValueError(f"NovoGrad supports norm_type 2 (L2) and 0 (max-abs); got {norm_type}.")
