"""`apex.amp.utils`: apex's small cast helpers.

They cast floating tensors on any device, as apexlite's O1 does (apex's casts skipped non-CUDA
tensors). Helpers that only served apex's own O1 patching and weight cache (set_func_save, the RNN
weight flattening) come from the table as placeholders that raise with the alternative.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Dict, Iterable, Iterator, List, Set, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.compat import generic
from apexlite.compat.apex.amp import compat  # noqa: F401  (apex's utils module has it)

log = get_logger("amp")


def is_cuda_enabled() -> bool:
    """Whether torch was built with CUDA."""
    return torch.version.cuda is not None


def get_cuda_version() -> Tuple[int, ...]:
    """torch's CUDA version as a tuple of ints, e.g. (12, 4)."""
    if torch.version.cuda is None:
        raise RuntimeError("get_cuda_version: this torch is a CPU build (torch.version.cuda is None).")
    return tuple(int(part) for part in torch.version.cuda.split("."))


def is_nested(x: Any) -> bool:
    """Whether `x` is a tuple or list."""
    return isinstance(x, (tuple, list))


def is_fp_tensor(x: Any) -> bool:
    """A floating-point tensor, or a (nested) tuple/list made only of them."""
    if is_nested(x):
        return all(is_fp_tensor(item) for item in x)
    return torch.is_tensor(x) and torch.is_floating_point(x)


def type_string(x: torch.Tensor) -> str:
    """The legacy tensor type name without its module: 'FloatTensor', 'HalfTensor', ..."""
    return x.type().split(".")[-1]


def should_cache(x: Any) -> bool:
    """Whether a cast of `x` may be cached: fp32 Parameters (or tuples/lists of only them)."""
    if is_nested(x):
        return all(should_cache(item) for item in x)
    return isinstance(x, torch.nn.Parameter) and type_string(x) == "FloatTensor"


def collect_fp_tensor_types(args: Iterable[Any], kwargs: Dict[str, Any]) -> Set[str]:
    """The type strings of the floating tensors among the arguments (nested tuples/lists walked)."""
    found: Set[str] = set()

    def collect(x: Any) -> None:
        if is_nested(x):
            for item in x:
                collect(item)
        else:
            found.add(type_string(x))

    for value in itertools.chain(args, kwargs.values()):
        if is_fp_tensor(value):
            collect(value)
    return found


def _cast(x: Any, dtype: torch.dtype, name: str, verbose: bool) -> Any:
    if is_nested(x):
        return type(x)(_cast(item, dtype, name, verbose) for item in x)
    if x.dtype == dtype:
        return x
    if verbose:
        log.info("%s->%s (%s)", type_string(x).replace("Tensor", ""), "Half" if dtype is torch.half else "Float",
                 name)
    return x.to(dtype)


def maybe_half(x: Any, name: str = "", verbose: bool = False) -> Any:
    """`x` in float16 (tuples/lists element-wise); a tensor already float16 is returned as is."""
    return _cast(x, torch.half, name, verbose)


def maybe_float(x: Any, name: str = "", verbose: bool = False) -> Any:
    """`x` in float32 (tuples/lists element-wise); a tensor already float32 is returned as is."""
    return _cast(x, torch.float, name, verbose)


def casted_args(cast_fn: Callable[[Any], Any], args: Iterable[Any], kwargs: Dict[str, Any]) -> List[Any]:
    """`args` with `cast_fn` applied to each floating tensor; `kwargs` is cast in place, as apex did."""
    for key, value in kwargs.items():
        if is_fp_tensor(value):
            kwargs[key] = cast_fn(value)
    return [cast_fn(x) if is_fp_tensor(x) else x for x in args]


def cached_cast(cast_fn: Callable[[Any], Any], x: Any, cache: Dict[Any, Any]) -> Any:
    """`cast_fn(x)`, also stored as `cache[x]`."""
    cache[x] = cast_fn(x)
    return cache[x]


def verbosify(cast_fn: Callable[..., Any], fn_name: str, verbose: bool) -> Callable[..., Any]:
    """`cast_fn` bound to log its casts under `fn_name` when `verbose`."""
    return functools.partial(cast_fn, name=fn_name, verbose=verbose) if verbose else cast_fn


def as_inplace(fns: Iterable[str]) -> Iterator[str]:
    """The in-place names of `fns` (`exp` -> `exp_`)."""
    return (name + "_" for name in fns)


def has_func(mod: Any, fn: str) -> bool:
    """Whether module/object (or dict) `mod` has `fn`."""
    return fn in mod if isinstance(mod, dict) else hasattr(mod, fn)


def get_func(mod: Any, fn: str) -> Any:
    """`mod[fn]` for a dict, else `getattr(mod, fn)`."""
    return mod[fn] if isinstance(mod, dict) else getattr(mod, fn)


def set_func(mod: Any, fn: str, new_fn: Any) -> None:
    """`mod[fn] = new_fn` for a dict, else `setattr(mod, fn, new_fn)` (the caller's own patch, not recorded)."""
    if isinstance(mod, dict):
        mod[fn] = new_fn
    else:
        setattr(mod, fn, new_fn)


__getattr__ = generic.fallback_getattr(__name__)
