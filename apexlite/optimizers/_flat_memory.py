"""Where FusedAdam's flat buffers live, and how a tensor is moved into one (NOTE [flat buffers] in
_flat_buffers.py): which params may be flattened, how they split into buffers, the buffers' allocations,
re-pointing a tensor."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from apexlite.optimizers import _adam_state as adam_state

# Where each role's buffer starts in its allocation, in bytes. Large allocations all start at the same
# offset within a page, and a CPU loop streaming four arrays whose addresses agree modulo 4096 stalls
# on 4K aliasing (the step ran about 40% slower); distinct starts avoid it. Multiples of 512 keep the
# CUDA kernel's vector loads aligned.
MAX_BUFFER_ELEMENTS = 1 << 28
START_BYTES = {"weights": 0, "copies": 512, "exp_avg": 1024, "exp_avg_sq": 2048, "grad": 3072}


class OwnedBuffers:
    """The buffers this owner made and that are still alive, known by address (weakly held)."""

    def __init__(self) -> None:
        self._refs: Dict[int, StorageWeakRef] = {}

    def add(self, buffer: torch.Tensor) -> None:
        self._refs[buffer.untyped_storage().data_ptr()] = StorageWeakRef(buffer.untyped_storage())

    def __contains__(self, storage: torch.UntypedStorage) -> bool:
        ref = self._refs.get(storage.data_ptr())
        return ref is not None and not ref.expired()  # a live storage at that address can only be ours

    def prune(self) -> None:
        self._refs = {address: ref for address, ref in self._refs.items() if not ref.expired()}


def flattenable(param: torch.Tensor, has_fused_path: Callable[[torch.device], bool], owned: OwnedBuffers) -> bool:
    """A plain Parameter on dense memory of its own (or in one of our buffers), of a dtype and on a
    device the fused paths take; not in shared memory (`model.share_memory()`: Hogwild's processes share the
    param's own storage, which a buffer would replace in this process only)."""
    if type(param) not in (torch.nn.Parameter, torch.Tensor) or param.layout != torch.strided:
        return False
    if param.device.type == "cpu" and param.is_shared():  # (a CUDA tensor always says shared)
        return False
    if param.dtype not in adam_state.SUPPORTED_DTYPES or param.numel() == 0 or param.is_inference():
        return False
    if not adam_state.is_dense(param) or param._is_view() or not has_fused_path(param.device):
        return False
    storage = param.untyped_storage()
    if storage in owned:
        return True
    whole = param.storage_offset() == 0 and storage.nbytes() == param.numel() * param.element_size()
    return whole and torch._C._storage_Use_Count(storage._cdata) == 2  # the param's and this handle


def start_of(role: str, dtype: torch.dtype) -> int:
    return START_BYTES[role] // torch.empty(0, dtype=dtype).element_size()


def new_buffer(role: str, total: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed 1-D buffer of ``total`` elements for ``role``, at its own start in its allocation."""
    start = start_of(role, dtype)
    storage = torch.zeros(start + total, dtype=dtype, device=device).untyped_storage()
    return torch.empty(0, dtype=dtype, device=device).set_(storage, start, (total,), (1,))


def alias(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s shape and strides on ``buffer``'s memory from ``offset`` (no autograd base)."""
    return torch.empty(0, dtype=buffer.dtype, device=buffer.device).set_(
        buffer.untyped_storage(), buffer.storage_offset() + offset, like.shape, like.stride())


def repoint(tensor: torch.Tensor, alias: torch.Tensor) -> None:
    """Puts ``tensor`` on ``alias``'s memory. A tensor that requires grad goes through ``.data``:
    ``Tensor.set_`` would give it a new grad accumulator, dropping the hooks on the old one (DDP's)."""
    if tensor.requires_grad:
        tensor.data = alias
    else:
        tensor.set_(alias)


def move_into(state: Dict[str, Any], key: str, buffer: torch.Tensor, offset: int, like: torch.Tensor) -> None:
    """Points ``state[key]`` at ``buffer`` from ``offset``: the same tensor object when it can be."""
    current = state.get(key)
    if (current is not None and current.dtype == buffer.dtype and current.device == buffer.device
            and current.shape == like.shape):
        try:
            repoint(current, alias(buffer, offset, like))
            return
        except RuntimeError:  # made by .detach()/.data: no metadata changes allowed
            pass
    dict.__setitem__(state, key, alias(buffer, offset, like))


def step_values(states: Sequence[Dict[str, Any]]) -> List[float]:
    """Each state's step count (0 where it has none), read from the devices in one copy per device."""
    values = [0.0] * len(states)
    by_device: Dict[torch.device, List[int]] = {}
    for index, state in enumerate(states):
        if "step" in state:
            by_device.setdefault(torch.as_tensor(state["step"]).device, []).append(index)
    for indices in by_device.values():
        counts = torch.stack([torch.as_tensor(states[i]["step"], dtype=torch.float32).reshape(()) for i in indices])
        for index, count in zip(indices, counts.tolist()):
            values[index] = count
    return values


def chunks(params: List[torch.Tensor]) -> List[List[torch.Tensor]]:
    """``params`` in consecutive runs of at most MAX_BUFFER_ELEMENTS elements (a larger param alone)."""
    chunks: List[List[torch.Tensor]] = [[]]
    size = 0
    for param in params:
        if chunks[-1] and size + param.numel() > MAX_BUFFER_ELEMENTS:
            chunks.append([])
            size = 0
        chunks[-1].append(param)
        size += param.numel()
    return chunks
