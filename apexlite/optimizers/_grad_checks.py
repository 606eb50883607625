"""What FusedAdam's grad check asks of one param and its grad, in Python: the twins of
csrc/torch/grad_checks.h, used by _flat_grads.py when apexlite's compiled library is not loaded."""
from __future__ import annotations

from typing import List, Optional

import torch


def use_count(storage: torch.UntypedStorage) -> int:
    """References to ``storage``'s memory: tensors using it, plus this Python handle."""
    return torch._C._storage_Use_Count(storage._cdata)


def same_layout(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """Equal strides on every dim that addresses memory (size > 1): the same dense block."""
    return grad.shape == param.shape and all(
        g == p for size, g, p in zip(param.shape, grad.stride(), param.stride()) if size > 1)


def lies_at(grad: Optional[torch.Tensor], param: torch.Tensor, dtype: torch.dtype, start: int) -> bool:
    """A grad where a set's grad buffer holds it: of ``dtype``, dense, on its param's device, laid out like it
    from element ``start`` of its storage (the storage itself is checked by the caller)."""
    return grad is not None and grad.dtype == dtype and grad.layout == torch.strided and \
        grad.device == param.device and grad.storage_offset() == start and same_layout(grad, param)


def movable(grad: torch.Tensor) -> bool:
    """A grad whose storage may be re-pointed: its own memory, used by no other tensor."""
    if grad._is_view() or grad.requires_grad or grad.is_inference() or use_count(grad.untyped_storage()) != 2:
        return False
    try:
        grad.set_(grad)  # refused for tensors made by .data/.detach() (no metadata changes allowed)
    except RuntimeError:
        return False
    return True


def readable(grad: torch.Tensor) -> bool:
    """A grad the kernels can read where it is though it cannot move: plain memory (no Python subclass)
    holding the values as they read (no lazy negation)."""
    return not grad.is_neg() and not torch._C._dispatch_keys(grad).has(torch._C.DispatchKey.Python)


def any_shared(pinned: List[torch.Tensor], buffer: Optional[torch.UntypedStorage]) -> bool:
    """Whether two of the grads share memory, or one lies in the grad buffer: grads are read where they are
    only when each element belongs to one grad (the kernels may write the unscaled grads)."""
    extents = []
    for grad in pinned:
        storage = grad.untyped_storage()
        if buffer is not None and storage._cdata == buffer._cdata:
            return True
        extents.append((storage._cdata, grad.storage_offset(), grad.storage_offset() + grad.numel()))
    extents.sort()
    return any(a[0] == b[0] and b[1] < a[2] for a, b in zip(extents, extents[1:]))
