"""`amp_C`: apex's multi-tensor kernels that third-party code calls directly, on torch foreach ops.

Argument order follows apex: (chunk_size, noop_flag, tensor_lists, *args). `chunk_size` is accepted
and unused (torch's foreach ops do their own chunking). Like apex, the scale, axpby and l2norm ops
set `noop_flag` to 1 when they meet a non-finite input and still compute every output.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from apexlite.compat._unsupported import unsupported
from apexlite.compat.loss_scale_hysteresis import update_scale_hysteresis  # noqa: F401  (an amp_C op)

Lists = Sequence[Sequence[torch.Tensor]]


def _check_depth(tensor_lists: Lists, depth: int, op: str) -> None:
    if len(tensor_lists) != depth:
        raise ValueError(f"{op} takes {depth} tensor lists; got {len(tensor_lists)}.")
    if not tensor_lists[0]:
        raise ValueError(f"{op}: the tensor lists are empty.")
    lengths = {len(lst) for lst in tensor_lists}
    if len(lengths) != 1:
        raise ValueError(f"{op}: size mismatch among tensor lists (lengths {sorted(lengths)}).")
    for tensors in zip(*tensor_lists):
        if len({t.numel() for t in tensors}) != 1:
            raise ValueError(f"{op}: size mismatch between tensors at the same index: "
                             f"{[tuple(t.shape) for t in tensors]}.")


def _flag_non_finite(noop_flag: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    """Set noop_flag to 1 when any tensor holds inf/NaN (device-side, no host sync)."""
    norms = torch._foreach_norm([t.float() for t in tensors], float("inf"))
    bad = (~torch.isfinite(torch.stack(norms))).any()
    noop_flag.copy_(torch.where(bad, torch.ones_like(noop_flag), noop_flag))


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, scale: float) -> None:
    """out[i] = float(in[i]) * scale, written in out[i]'s dtype."""
    _check_depth(tensor_lists, 2, "multi_tensor_scale")
    inputs, outputs = list(tensor_lists[0]), list(tensor_lists[1])
    _flag_non_finite(noop_flag, inputs)
    scaled = torch._foreach_mul([t.float() for t in inputs], float(scale))
    for out, value in zip(outputs, scaled):
        out.copy_(value.view_as(out))


def multi_tensor_axpby(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists, a: float, b: float,
                       arg_to_check: int) -> None:
    """out[i] = a*x[i] + b*y[i]; inf/NaN is checked in x (0), y (1) or both (-1)."""
    _check_depth(tensor_lists, 3, "multi_tensor_axpby")
    xs, ys, outs = (list(lst) for lst in tensor_lists)
    checked = {0: xs, 1: ys, -1: xs + ys}.get(arg_to_check)
    if checked is None:
        raise ValueError(f"multi_tensor_axpby: arg_to_check must be -1, 0 or 1; got {arg_to_check}.")
    _flag_non_finite(noop_flag, checked)
    for x, y, out in zip(xs, ys, outs):
        out.copy_((a * x.float() + b * y.float()).view_as(out))


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                        per_tensor: Optional[bool] = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(total L2 norm, per-tensor norms), as apex returned them: fp32 tensors on the tensors' device,
    the total of shape (1,), the per-tensor norms of shape (len(tensors),), or (0,) unless `per_tensor`."""
    _check_depth(tensor_lists, 1, "multi_tensor_l2norm")
    tensors = [t.float() for t in tensor_lists[0]]
    _flag_non_finite(noop_flag, tensors)
    norms = torch.stack(torch._foreach_norm(tensors, 2.0))
    total = norms.norm(2).reshape(1)
    return total, (norms if per_tensor else torch.empty(0, dtype=torch.float32, device=total.device))


def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Lists,
                                inv_scale: torch.Tensor, per_tensor: Optional[bool] = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """The L2 norm of the tensors multiplied by `inv_scale` (the tensors themselves are unchanged)."""
    _check_depth(tensor_lists, 1, "multi_tensor_unscale_l2norm")
    scaled = [[t.float() * inv_scale for t in tensor_lists[0]]]
    return multi_tensor_l2norm(chunk_size, noop_flag, scaled, per_tensor)


_OPTIMIZER_ADVICE = "Use the optimizer class instead: apex.optimizers.{} (apexlite provides it)."
_OPTIMIZER_KERNELS = {  # apex's optimizer kernels -> the class that runs the same update
    "multi_tensor_sgd": "FusedSGD", "multi_tensor_adam": "FusedAdam", "multi_tensor_adam_capturable": "FusedAdam",
    "multi_tensor_adam_capturable_master": "FusedAdam", "multi_tensor_adagrad": "FusedAdagrad",
    "multi_tensor_novograd": "FusedNovoGrad", "multi_tensor_lamb": "FusedLAMB",
    "multi_tensor_lamb_stage1_cuda": "FusedLAMB", "multi_tensor_lamb_stage2_cuda": "FusedLAMB",
    "multi_tensor_lamb_mp": "FusedMixedPrecisionLamb",
}
_NORM_VARIANTS = ("multi_tensor_l2norm_mp", "multi_tensor_l2norm_scale")
globals().update({name: unsupported(f"amp_C.{name}", _OPTIMIZER_ADVICE.format(optimizer))
                  for name, optimizer in _OPTIMIZER_KERNELS.items()})
globals().update({name: unsupported(f"amp_C.{name}", "Use amp_C.multi_tensor_l2norm (and amp_C.multi_tensor_scale "
                                    "for the scaled copy).") for name in _NORM_VARIANTS})
