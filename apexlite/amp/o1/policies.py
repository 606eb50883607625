"""Cast policies and the dtype rules shared by every O1 wrapper.

Rules (as torch.autocast, not as apex): only floating tensors are cast, never float64, integer or
bool tensors; only tensors on the session's device types (NOTE [device scope] in device_scope.py); a Tensor subclass is
converted as torch converts it (CONVERTERS below), never through a Python override of its `.half()`.

NOTE [walking arguments] (the native path, csrc/torch/o1_cast_args.cpp, follows the same rules)
- Lists, tuples and dicts (subclasses included) are walked recursively. Each is read once, as a
  snapshot (`tuple(a_list)`, `tuple(dict.items(a_dict))`), before anything inside it is cast: another
  thread's edits land before or after the read, never in the middle of the walk.
- A container holding nothing that changed is passed on as the very same object; one holding a cast
  tensor is rebuilt with its own type (`rebuild`: a defaultdict keeps its factory).
- Nesting is bounded by Python's recursion limit: a self-containing or absurdly deep structure raises
  RecursionError on both paths. The native walk also stops at 10,000 levels (its C stack's bound), so a
  program that raises the recursion limit above that sees RecursionError there first.
- What counts as a tensor: here `isinstance(value, torch.Tensor)`, which honours an overridden
  `__class__` (a mock); the native path checks the object's real type, so it never reads a mock as a
  tensor. Both pass such an object on unchanged (a mock's dtype is not a castable one).
"""
from __future__ import annotations

import collections
import enum
import operator
from typing import Any, Callable, List, Optional, Set

import torch

# dtypes an O1 wrapper may cast from or to. float64 is deliberately absent.
CASTABLE_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

# target dtype -> the Tensor method producing the same copy as `.to(dtype)` (autograd included);
# these parse their arguments in about half the time `.to` needs, and the cast path runs per argument.
# Called unbound, they honour a subclass's __torch_function__ but never a Python override of its
# `.half()` (torch.autocast converts the same way); the native path calls these very objects for subclasses.
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


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor],
                other: Optional[Callable[[Any], Any]] = None) -> Any:
    """Apply `fn` to every tensor in a nested structure, and `other` (when given) to every other leaf;
    NOTE [walking arguments]."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        items = tuple(value)
        mapped = [map_tensors(item, fn, other) for item in items]
        if all(map(operator.is_, mapped, items)):
            return value
        return rebuild(value, mapped)
    if isinstance(value, dict):
        pairs = tuple(dict.items(value))  # one read: keys and values from the same moment
        items = [item for _, item in pairs]
        mapped = [map_tensors(item, fn, other) for item in items]
        if all(map(operator.is_, mapped, items)):
            return value
        return rebuild(value, [(key, item) for (key, _), item in zip(pairs, mapped)])
    return value if other is None else other(value)


def rebuild(container: Any, items: List[Any]) -> Any:
    """A container of `container`'s type holding `items` (for a dict: (key, value) pairs).

    Subclasses are rebuilt through their constructor, as the O2 input/output casts always did: namedtuples
    positionally, a defaultdict with its factory, other list/tuple/dict subclasses from the items.
    """
    kind = type(container)
    if kind is list:
        return items
    if kind is tuple:
        return tuple(items)
    if kind is dict:
        return dict(items)
    if isinstance(container, tuple) and hasattr(container, "_fields"):
        return kind(*items)
    if isinstance(container, collections.defaultdict):
        return kind(container.default_factory, items)
    return kind(items)


ScopeCheck = Optional[Callable[[torch.Tensor], bool]]  # CastState.scope_check: None when every device is cast


def collect_float_dtypes(value: Any, found: Set[torch.dtype], in_scope: ScopeCheck = None) -> None:
    """Add the castable floating dtypes of every tensor inside `value` that O1 casts (`in_scope`) to `found`."""
    if isinstance(value, torch.Tensor):
        if value.dtype in CASTABLE_DTYPES and (in_scope is None or in_scope(value)):
            found.add(value.dtype)
    elif isinstance(value, (list, tuple)):
        for item in tuple(value):
            collect_float_dtypes(item, found, in_scope)
    elif isinstance(value, dict):
        for item in tuple(dict.values(value)):
            collect_float_dtypes(item, found, in_scope)


def widest(dtypes: Set[torch.dtype]) -> Optional[torch.dtype]:
    """The promoted dtype of a set (fp16 + bf16 -> fp32), or None for an empty set."""
    result = None
    for dtype in dtypes:
        result = dtype if result is None else torch.promote_types(result, dtype)
    return result


def is_low_precision(value: Any, in_scope: ScopeCheck = None) -> bool:
    """True for an fp16/bf16 tensor O1 casts (`in_scope`), or a list/tuple containing one."""
    if isinstance(value, torch.Tensor):
        return value.dtype in (torch.float16, torch.bfloat16) and (in_scope is None or in_scope(value))
    if isinstance(value, (list, tuple)):
        return any(is_low_precision(item, in_scope) for item in value)
    return False
