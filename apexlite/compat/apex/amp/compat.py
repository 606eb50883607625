"""`apex.amp.compat`: apex's checks for pre-0.4 torch (Variables and Tensors merged long ago)."""
from __future__ import annotations

from typing import Any, Iterable, List

import torch


def variable_is_tensor() -> bool:
    """True: a torch.autograd.Variable is a Tensor (always, since torch 0.4)."""
    return isinstance(torch.autograd.Variable(torch.empty(0)), torch.Tensor)


def tensor_is_variable() -> bool:
    """False: `torch.Tensor()` is a Tensor, not a Variable (since torch 0.4)."""
    return type(torch.empty(0)) is torch.autograd.Variable


def tensor_is_float_tensor() -> bool:
    """False: `torch.Tensor()` is of type Tensor, not the legacy FloatTensor type (since torch 0.4)."""
    return type(torch.empty(0)) is torch.FloatTensor


def is_tensor_like(x: Any) -> bool:
    """Whether `x` is a tensor."""
    return torch.is_tensor(x)


def is_floating_point(x: Any) -> bool:
    """`torch.is_floating_point(x)` (float16, bfloat16, float32 or float64)."""
    return torch.is_floating_point(x)


def scalar_python_val(x: Any) -> Any:
    """The Python number of a one-element tensor (`x.item()`), else `x[0]`."""
    return x.item() if hasattr(x, "item") else x[0]


def filter_attrs(module: Any, attrs: Iterable[str]) -> List[str]:
    """The names in `attrs` that `module` has, in order (ops some torch versions lack are dropped)."""
    return [name for name in attrs if hasattr(module, name)]
