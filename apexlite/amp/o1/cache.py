"""CastCache: each weight is cast once per iteration and never served stale.

NOTE [cast cache invalidation]
- Keys are weights: leaf tensors that are Parameters or require grad. Activations are never cached.
- An entry remembers the source's autograd version counter (`_version`) and data pointer. Any
  in-place update of the weight (optimizer step, `p.add_`, `p.copy_`) bumps the counter, and
  `p.data = w` moves the data pointer, so the entry is a miss and the weight is cast afresh.
- Writes through `p.data.copy_(w)` (EMA/SWA swaps, loading helpers, clipping outside the optimizer)
  change neither. They are covered by the cache's lifetime: it is cleared when the outermost forward
  of a model passed to `initialize` returns (so a weight used several times in one forward is still
  cast once), at every iteration boundary (the end of `scale_loss`) and after every optimizer step.
- A cast made under `no_grad` carries no autograd history. It is served again only while grad mode
  is off; a grad-enabled forward that needs the weight's gradient recasts and replaces it.
- Nothing is cached under `inference_mode` (inference tensors cannot enter a later autograd graph).
- Each weight has at most one entry, so an eval-only loop that never reaches `scale_loss` holds at
  most one low-precision copy per weight: the cache is bounded by the model size.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from apexlite.amp.o1.policies import CONVERTERS


def _compile_flag():
    """torch.compiler.is_compiling (torch >= 2.3), torch._dynamo's older spelling, or never."""
    compiler = getattr(torch, "compiler", None)
    flag = getattr(compiler, "is_compiling", None)
    if flag is None:
        flag = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return flag if flag is not None else (lambda: False)


tracing = _compile_flag()


class CastCache:
    """Per-session cache of weight casts, keyed by weight identity and target dtype."""

    def __init__(self) -> None:
        # (id(weight), dtype) -> (weight, its _version and data_ptr() at the cast, the cast)
        self._entries: Dict[Tuple[int, torch.dtype], Tuple[torch.Tensor, int, int, torch.Tensor]] = {}
        self.casts = 0  # weight casts actually performed since the last `reset_counters`
        self.hits = 0

    def cast(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` converted to `dtype`; weights are served from the cache while the cached copy is valid.

        Weights are leaves that require grad or are Parameters (`type(...) is not torch.Tensor` spares
        plain tensors Parameter's Python-level isinstance check: this runs on every patched call).
        """
        if not (tensor.is_leaf and (tensor.requires_grad or (
                type(tensor) is not torch.Tensor and isinstance(tensor, torch.nn.Parameter)))) or tracing():
            # activations are never cached; nor is anything while torch.compile traces (the graph
            # holds its own casts, and traced tensors have no data pointer to validate an entry with)
            return CONVERTERS[dtype](tensor)
        key = (id(tensor), dtype)
        entry = self._entries.get(key)
        if entry is not None:
            source, version, address, cast = entry
            if (source is tensor and version == tensor._version and address == tensor.data_ptr()
                    and (cast.requires_grad or not (tensor.requires_grad and torch.is_grad_enabled()))):
                self.hits += 1
                return cast
        cast = CONVERTERS[dtype](tensor)
        self.casts += 1
        if not torch.is_inference_mode_enabled():
            self._entries[key] = (tensor, tensor._version, tensor.data_ptr(), cast)
        return cast

    def remove(self, weight: torch.Tensor) -> None:
        """Forget every cast of `weight` (the handle API's `remove_cache`)."""
        for key in [key for key, entry in self._entries.items() if entry[0] is weight]:
            del self._entries[key]

    def entries(self) -> list:
        """[(weight, version, data pointer, cast), ...] (for inspection and tests)."""
        return list(self._entries.values())

    def __contains__(self, weight: object) -> bool:
        return any(entry[0] is weight for entry in self._entries.values())

    def clear(self) -> None:
        """Drop every entry (iteration boundary)."""
        self._entries.clear()

    def reset_counters(self) -> None:
        self.casts = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)
