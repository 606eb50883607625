"""Cast policies and the dtype rules shared by every O1 wrapper.

Rules (as torch.autocast, not as apex): only floating tensors are cast, never float64, integer or
bool tensors; tensors on any device are cast (apex cast only CUDA tensors); containers are walked
recursively (lists, tuples, namedtuples, dicts) keeping their types.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, Optional, Set

import torch

# dtypes an O1 wrapper may cast from or to. float64 is deliberately absent.
CASTABLE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

# target dtype -> the Tensor method producing the same copy as `.to(dtype)` (autograd included);
# these parse their arguments in about half the time `.to` needs, and the cast path runs per argument.
CONVERTERS = {torch.float32: torch.Tensor.float, torch.float16: torch.Tensor.half,
              torch.bfloat16: torch.Tensor.bfloat16}


class CastPolicy(enum.Enum):
    """What an O1 wrapper does to the floating tensors among a call's arguments."""

    LOW_PRECISION = "cast to the low-precision dtype (fp16 or bf16)"
    FLOAT = "cast to float32"
    PROMOTE = "cast all to the widest floating dtype among them"
    SEQUENCE_PROMOTE = "like PROMOTE, over the tensors of the first (sequence) argument"
    MATCH_SELF = "cast the other arguments to self's dtype (in-place methods)"
    INPLACE_FLOAT = "in-place op forced to fp32: refuse low-precision self, cast the rest to fp32"
    BANNED = "refuse low-precision inputs with an explanation"


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply `fn` to every tensor in a nested structure, rebuilding containers of the same type."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        items = [map_tensors(item, fn) for item in value]
        if isinstance(value, list):
            return items
        if hasattr(value, "_fields"):  # namedtuple: positional constructor
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, dict):
        return type(value)((key, map_tensors(item, fn)) for key, item in value.items())
    return value


def collect_float_dtypes(value: Any, found: Set[torch.dtype]) -> None:
    """Add the castable floating dtypes of every tensor inside `value` to `found`."""
    if isinstance(value, torch.Tensor):
        if value.dtype in CASTABLE_DTYPES:
            found.add(value.dtype)
    elif isinstance(value, (list, tuple)):
        for item in value:
            collect_float_dtypes(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            collect_float_dtypes(item, found)


def widest(dtypes: Set[torch.dtype]) -> Optional[torch.dtype]:
    """The promoted dtype of a set (fp16 + bf16 -> fp32), or None for an empty set."""
    result = None
    for dtype in dtypes:
        result = dtype if result is None else torch.promote_types(result, dtype)
    return result


def is_low_precision(value: Any) -> bool:
    """True for an fp16/bf16 tensor, or a list/tuple containing one."""
    if isinstance(value, torch.Tensor):
        return value.dtype in (torch.float16, torch.bfloat16)
    if isinstance(value, (list, tuple)):
        return any(is_low_precision(item) for item in value)
    return False
