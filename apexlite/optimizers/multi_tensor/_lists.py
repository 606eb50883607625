"""Argument checks and flag handling shared by the multi-tensor kernels (apex's `amp_C` contract).

Every kernel takes ``(chunk_size, noop_flag, tensor_lists, *args)``: ``tensor_lists`` holds lists of
equal length whose tensors at one index have equal element counts, and ``noop_flag`` is a one-element
int tensor (``torch.tensor([0], dtype=torch.int)``). Kernels that honour the flag skip their work when
it is nonzero; kernels that check their inputs set it to 1 when they meet inf/NaN.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch

Lists = Sequence[Sequence[torch.Tensor]]
Scalar = Union[float, torch.Tensor]


def check_lists(tensor_lists: Lists, depths: Tuple[int, ...], op: str) -> List[List[torch.Tensor]]:
    """The lists as Python lists, after apex's checks: a known depth, no empty or ragged lists."""
    if len(tensor_lists) not in depths:
        wanted = " or ".join(str(depth) for depth in depths)
        raise ValueError(f"{op} takes {wanted} tensor lists; got {len(tensor_lists)}.")
    lists = [list(tensors) for tensors in tensor_lists]
    if not lists[0]:
        raise ValueError(f"{op}: the tensor lists are empty (apex's kernels need at least one tensor).")
    lengths = {len(tensors) for tensors in lists}
    if len(lengths) != 1:
        raise ValueError(f"{op}: size mismatch among tensor lists (lengths {sorted(lengths)}).")
    for index, tensors in enumerate(zip(*lists)):
        if any(not isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"{op}: entry {index} of the tensor lists is not a tensor "
                            f"({[type(t).__name__ for t in tensors]}); drop params without a grad first.")
        if len({t.numel() for t in tensors}) != 1:
            raise ValueError(f"{op}: size mismatch between tensors at index {index}: "
                             f"{[tuple(t.shape) for t in tensors]}.")
        if len({t.device for t in tensors}) != 1:
            raise ValueError(f"{op}: tensors at index {index} are on different devices "
                             f"{sorted({str(t.device) for t in tensors})}; one call works on one device.")
        if any(t.is_sparse for t in tensors):
            raise RuntimeError(f"{op}: tensor at index {index} is sparse; the kernels need dense tensors.")
    return lists


def check_float_dtypes(tensors: Sequence[torch.Tensor], allowed: Tuple[torch.dtype, ...], what: str, op: str) -> None:
    """A TypeError naming the first tensor whose dtype the kernel cannot read."""
    for index, tensor in enumerate(tensors):
        if tensor.dtype not in allowed:
            names = ", ".join(str(dtype).replace("torch.", "") for dtype in allowed)
            raise TypeError(f"{op}: {what}[{index}] is {tensor.dtype}; the kernel reads {names}.")


def noop_is_set(noop_flag: torch.Tensor) -> bool:
    """Whether a kernel that honours the flag must skip (one read of the flag on the host)."""
    return bool(noop_flag.reshape(-1)[0].item() != 0)


def raise_flag_if_non_finite(noop_flag: torch.Tensor, values: torch.Tensor) -> None:
    """Sets noop_flag to 1 when any element of ``values`` is inf/NaN, on the device (no host sync)."""
    bad = (~torch.isfinite(values)).any().to(device=noop_flag.device)
    noop_flag.copy_(torch.where(bad, torch.ones_like(noop_flag), noop_flag))


def to_float(value: Scalar) -> float:
    """A Python float from a number or a one-element tensor (a host read for device tensors).

    Under CUDA graph capture that read is impossible; the error says so instead of a CUDA error.
    """
    if not isinstance(value, torch.Tensor):
        return float(value)
    if value.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("apexlite's multi-tensor kernels read the learning rate on the host, which a CUDA "
                           "graph capture forbids; run this optimizer step outside torch.cuda.graph().")
    return float(value.reshape(-1)[0].item())
