"""Memory layouts for params and grads, as data: every optimizer test that cares about strides uses these.

Each layout builds a tensor of the given values with its own strides. A gradient's layout is whatever
autograd or the user left (channels_last from a conv fed channels_last input, a transposed matmul
grad, a slice of a flat buffer, a broadcast ``expand``), and it may differ from its param's; optimizer
results must not depend on it. The layouts are written for 4-D shapes (a conv weight), which every
one of them can take. ``SHAPES`` holds two: one with distinct sizes, so a transposition cannot hide,
and one with a size-1 dim (a conv weight with one input channel), on which channels_last strides
differ from contiguous ones only where the stride addresses no memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

import torch

SHAPES = [(4, 3, 2, 5), (4, 1, 3, 5)]


def _transposed(values: torch.Tensor) -> torch.Tensor:
    """Dims in reverse memory order (what ``.t()`` does to a matrix): dense, not contiguous."""
    order = list(reversed(range(values.dim())))
    return values.permute(order).contiguous().permute(order)


def _strided_slice(values: torch.Tensor) -> torch.Tensor:
    """Every other element of a twice-wider buffer along the last dim: gaps between elements."""
    buffer = torch.full((*values.shape[:-1], 2 * values.shape[-1]), float("nan"), dtype=values.dtype)
    view = buffer[..., ::2]
    view.copy_(values)
    return view


def _offset_view(values: torch.Tensor) -> torch.Tensor:
    """A contiguous view that starts 3 elements into its storage."""
    buffer = torch.full((values.numel() + 3,), float("nan"), dtype=values.dtype)
    view = buffer[3:].view(values.shape)
    view.copy_(values)
    return view


def _expanded(values: torch.Tensor) -> torch.Tensor:
    """The first slice along dim 0 broadcast over that dim (stride 0): elements share memory."""
    return values[:1].clone().expand(values.shape)


@dataclass(frozen=True)
class Layout:
    """A way to lay ``values`` out in memory; ``overlapping`` layouts hold the first slice's values only."""

    name: str
    build: Callable[[torch.Tensor], torch.Tensor]
    overlapping: bool = False

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        return self.build(values)

    def __repr__(self) -> str:
        return self.name


CONTIGUOUS = Layout("contiguous", lambda values: values.clone())
CHANNELS_LAST = Layout("channels_last", lambda values: values.clone().contiguous(memory_format=torch.channels_last))
TRANSPOSED = Layout("transposed", _transposed)
STRIDED_SLICE = Layout("strided_slice", _strided_slice)
OFFSET_VIEW = Layout("offset_view", _offset_view)
EXPANDED = Layout("expanded", _expanded, overlapping=True)

# Layouts a param can have (an expanded param cannot be updated in place by any optimizer).
PARAM_LAYOUTS: List[Layout] = [CONTIGUOUS, CHANNELS_LAST, TRANSPOSED, STRIDED_SLICE, OFFSET_VIEW]
# Layouts a gradient can have.
GRAD_LAYOUTS: List[Layout] = PARAM_LAYOUTS + [EXPANDED]


def layout_pairs() -> List[Tuple[Layout, Layout]]:
    """Every (param layout, grad layout) combination, the grad's differing from the param's or not."""
    return [(param, grad) for param in PARAM_LAYOUTS for grad in GRAD_LAYOUTS]


def one_sided_pairs() -> List[Tuple[Layout, Layout]]:
    """Each grad layout with a contiguous param, and each param layout with a contiguous grad (the
    smaller set, for checks that repeat the full product's on other scenarios)."""
    return [(CONTIGUOUS, grad) for grad in GRAD_LAYOUTS] + [(param, CONTIGUOUS) for param in PARAM_LAYOUTS[1:]]



def same_bits(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two tensors hold bit-identical elements (NaN payloads and signed zeros included), in any layouts."""
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return False
    return torch.equal(actual.contiguous().view(-1).view(torch.uint8), expected.contiguous().view(-1).view(torch.uint8))
