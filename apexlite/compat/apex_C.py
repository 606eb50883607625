"""`apex_C`: apex's C++ helpers `flatten` and `unflatten` (built by apex's `--cpp_ext`).

`flatten(tensors)` concatenates dense tensors into one flat tensor; `unflatten(flat, tensors)` cuts a
flat tensor back into views shaped like `tensors`. apex's extension called torch's own C++
flatten/unflatten; these are the same functions from Python (torch._utils), same results.
"""
from __future__ import annotations

from typing import List, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["flatten", "unflatten"]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One 1-D tensor holding every tensor's elements, in order (all must share a dtype and device)."""
    return _flatten_dense_tensors(list(tensors))


def unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Views of `flat`, shaped like `tensors` in order (the inverse of `flatten`)."""
    return list(_unflatten_dense_tensors(flat, list(tensors)))
