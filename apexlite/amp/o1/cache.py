"""CastCache: each weight is cast once per iteration, never served stale, never kept alive by the cache.

NOTE [what the cache takes]
A tensor is cached only when all of these hold (apexlite._C.CastCache applies the same rules):
- it is a weight: a leaf of type exactly `torch.Tensor` that requires grad, or of type exactly
  `torch.nn.Parameter` (frozen ones too). Activations, inputs that need no grad and subclasses
  (Parameter subclasses included: their conversions may be their own) are converted on every call;
- it can be validated: strided, with real storage, not meta, not an inference tensor (those have no
  version counter), not wrapped by torch.func (grad, vmap, jacrev) or by functionalization;
- nothing traces it: no TorchDispatchMode is active (FakeTensorMode, make_fx, a user's mode) and
  torch.compile is not tracing (the graph holds its own casts).
Nothing is stored under `inference_mode` (such a cast cannot enter a later autograd graph).

NOTE [cast cache validity]
An entry is served only for the exact tensor it was cast from: the same tensor object, storage (the
same StorageImpl: held by a weak reference, its address cannot be reused meanwhile), storage offset,
shape, strides and dtype (the storage fixes the device), and the same autograd version counter. Every
stamp is read BEFORE the cast, so an in-place update that races the cast (another thread's step,
Hogwild workers) bumps the version past the stamp: the entry can only miss. So an optimizer step or
`p.add_` (version), `p.data = w` (storage), `w.data = w.data.t()` or `.view(...)` (shape or strides,
same storage and version) all make the next use cast afresh. Writes through `p.data.copy_(w)` (EMA/SWA
swaps, loading helpers, clipping outside the optimizer) change none of these; they are covered by the
cache's lifetime below. A cast made under `no_grad` carries no autograd history: it is served again
only while grad mode is off.

NOTE [cast cache lifetime]
The cache is cleared when the outermost forward of a model passed to `initialize` returns (so a
weight used several times in one forward is cast once), at every iteration boundary (the end of
`scale_loss`), after every optimizer step and when the session closes. Outside such a forward (a
model's other method, `model.encoder(x)`, a weight used in the training loop itself), a cast under
`no_grad` neither goes in nor comes out of the cache: evaluation is where EMA/SWA weights are swapped in
through `p.data.copy_`, which no stamp sees. There, with grad on, casts are cached until the next of
those points, as torch.autocast caches them until its region ends. Between those points:
- the casts of registered weights (`own`: the parameters of the models and optimizers registered
  with the session, taken whenever one is registered) are held strongly, at most one cast per weight
  and dtype. The session holds those weights anyway, so the cache adds at most one low-precision
  copy of each (an eval loop that never reaches `scale_loss` holds at most the registered models'
  size in low precision);
- every other tensor (fresh leaves that require grad, weights of models never passed to `initialize`)
  is referred to weakly, and so is its cast: the entry serves the cast only while something else keeps
  it (the autograd graph that saved it) and vanishes with either; a cast without autograd history of
  such a tensor is not stored at all, since nothing would keep it. So the cache never extends a
  tensor's life, and a loop that makes fresh leaves holds nothing: dead entries are pruned whenever
  the table has doubled since the last pruning, and `len()` counts live entries only.
"""
from __future__ import annotations

import weakref
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from apexlite.amp.o1.policies import CONVERTERS

_TENSOR = torch.Tensor
_PARAMETER = torch.nn.Parameter
_MIN_PRUNE_SIZE = 64


def compile_flag() -> Callable[[], bool]:
    """torch.compiler.is_compiling (torch >= 2.3), torch._dynamo's older spelling (torch 2.1, 2.2), or never."""
    compiler = getattr(torch, "compiler", None)
    flag = getattr(compiler, "is_compiling", None)
    if flag is None:
        flag = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return flag if flag is not None else (lambda: False)


tracing = compile_flag()
_dispatch_modes: Callable[[], int] = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_functorch_wrapped: Callable[[torch.Tensor], bool] = getattr(
    getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda tensor: False)
_functional: Callable[[torch.Tensor], bool] = getattr(torch, "_is_functional_tensor", lambda tensor: False)

# (id(weight), target dtype): the weight's identity is checked through the entry's weakref
_Key = Tuple[int, torch.dtype]
# An entry: (weakref to the weight, then _stamps(weight), then the cast when held strongly or None, then
# a weakref to the cast when held weakly or None). Plain tuples: the hit path unpacks one per call.
_Entry = tuple


def _stamps(tensor: torch.Tensor) -> Optional[tuple]:
    """(storage ref, version, offset, shape, strides, dtype) of a weight, or None when it cannot be
    validated (NOTE [what the cache takes]). Read before the cast.

    The storage is held by torch's own weak reference to the StorageImpl (as the C++ cache holds it),
    compared by address: while it is held the StorageImpl's memory cannot be reused, so an equal address
    is the same storage. A Python weakref to the storage object would not do: torch 2.1 makes a new
    storage object on every `untyped_storage()` call (the entry could never hit) and frees it without
    clearing its weak references (dropping the entry then crashed the interpreter)."""
    if (tensor.layout is not torch.strided or tensor.is_meta or tensor.is_inference()
            or _functorch_wrapped(tensor) or _functional(tensor)):
        return None
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor without real storage
        return None
    return (StorageWeakRef(storage), tensor._version, tensor.storage_offset(), tensor.shape, tensor.stride(),
            tensor.dtype)


class CastCache:
    """Per-session cache of weight casts, keyed by weight identity and target dtype."""

    def __init__(self) -> None:
        self._entries: Dict[_Key, _Entry] = {}
        self._owned: Dict[int, weakref.ref] = {}  # id(weight) -> weakref: registered weights (held strongly)
        self._owned_prune_at = _MIN_PRUNE_SIZE
        self._prune_at = _MIN_PRUNE_SIZE
        self.casts = 0  # weight casts actually performed since the last `reset_counters`
        self.hits = 0

    def cast(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` converted to `dtype`; weights are served from the cache while the cached copy is valid."""
        cls = type(tensor)
        if (not ((cls is _TENSOR or cls is _PARAMETER) and tensor.is_leaf and (tensor.requires_grad or cls is _PARAMETER))
                or tracing() or _dispatch_modes()):
            return CONVERTERS[dtype](tensor)
        key = (id(tensor), dtype)
        entry = self._entries.get(key)
        if entry is not None:
            source, storage, version, offset, shape, stride, source_dtype, cast, cast_ref = entry
            if (source() is tensor and storage.cdata == tensor.untyped_storage()._cdata
                    and version == tensor._version and offset == tensor.storage_offset()
                    and shape == tensor.shape and stride == tensor.stride() and source_dtype is tensor.dtype):
                if cast is None:
                    cast = cast_ref()
                if cast is not None and (cast.requires_grad or not (tensor.requires_grad and torch.is_grad_enabled())):
                    self.hits += 1
                    return cast
        stamps = _stamps(tensor)
        cast = CONVERTERS[dtype](tensor)
        if stamps is None or torch.is_inference_mode_enabled():
            self._entries.pop(key, None)
            if stamps is not None:
                self.casts += 1
            return cast
        self.casts += 1
        if self.owns(tensor):
            self._store(key, (weakref.ref(tensor),) + stamps + (cast, None))
        elif cast.requires_grad:  # held weakly: served while the autograd graph keeps the cast
            self._store(key, (weakref.ref(tensor),) + stamps + (None, weakref.ref(cast)))
        else:  # nothing but this cache would keep the cast of a tensor it does not own
            self._entries.pop(key, None)
        return cast

    def _store(self, key: _Key, entry: _Entry) -> None:
        self._entries[key] = entry
        if len(self._entries) >= self._prune_at:
            self._prune()
            self._prune_at = max(2 * len(self._entries), _MIN_PRUNE_SIZE)

    def _prune(self) -> None:
        """Drop entries whose source or (weakly held) cast has died."""
        for key, entry in list(self._entries.items()):
            if not _live(entry) and self._entries.get(key) is entry:
                del self._entries[key]

    def own(self, weights: Iterable[torch.Tensor]) -> None:
        """Add registered weights: their casts are held strongly (NOTE [cast cache lifetime]). Dead ones
        are dropped once the set has doubled, so each call costs what it adds."""
        for weight in weights:
            self._owned[id(weight)] = weakref.ref(weight)
        if len(self._owned) >= self._owned_prune_at:
            self._owned = {key: ref for key, ref in self._owned.items() if ref() is not None}
            self._owned_prune_at = max(2 * len(self._owned), _MIN_PRUNE_SIZE)

    def disown_all(self) -> None:
        """Forget every registered weight (the session's end)."""
        self._owned = {}
        self._owned_prune_at = _MIN_PRUNE_SIZE

    def owns(self, tensor: torch.Tensor) -> bool:
        ref = self._owned.get(id(tensor))
        return ref is not None and ref() is tensor

    def remove(self, weight: torch.Tensor) -> None:
        """Forget every cast of `weight` (the handle API's `remove_cache`)."""
        for key, entry in list(self._entries.items()):
            if entry[0]() is weight and self._entries.get(key) is entry:
                del self._entries[key]

    def entries(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """[(weight, cast), ...] of the live entries (for inspection and tests)."""
        live = []
        for entry in list(self._entries.values()):
            source, cast = entry[0](), entry[7] if entry[7] is not None else entry[8]()
            if source is not None and cast is not None:
                live.append((source, cast))
        return live

    def __contains__(self, weight: object) -> bool:
        return any(source is weight for source, _ in self.entries())

    def clear(self) -> None:
        """Drop every entry (iteration boundary)."""
        self._entries.clear()
        self._prune_at = _MIN_PRUNE_SIZE

    def reset_counters(self) -> None:
        self.casts = 0
        self.hits = 0

    def __len__(self) -> int:
        self._prune()
        return len(self._entries)


def _live(entry: _Entry) -> bool:
    return entry[0]() is not None and (entry[7] is not None or entry[8]() is not None)
