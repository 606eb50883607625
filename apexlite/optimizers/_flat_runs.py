"""A step's kernel calls over FusedAdam's flat buffer sets: one call per set, or, for a large set on a GPU,
one call per checked piece, so that the device starts on the first piece while the host checks the next
(NOTE [flat grads] in _flat_grads.py). Only this module and _flat_buffers.py know the buffers' layout."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

import torch

from apexlite.optimizers._flat_grads import READY, REBUILD, GradsReadInPlace, flat_grads, flat_grads_in_place

if TYPE_CHECKING:
    from apexlite.optimizers._flat_buffers import FlatSet


@dataclass(frozen=True)
class PiecePolicy:
    """Which sets are stepped in pieces, and how they are cut. A piece costs the host 11-13 us more than a
    set checked whole (a launch, a view of the grads: an ad-hoc loop on the 2-core CI VM), and checking a
    param 30-130 ns, so pieces pay only where the check is long (``min_members``) and the device has work
    to hide it behind (``min_elements``): a first piece of ``first`` members, so the device starts early,
    then runs of at least ``min_piece`` members, at most ``max_pieces`` pieces in all. The thresholds are
    reasoned, not yet measured on a GPU (bench_adam_tensor_counts' "FusedAdam one check" column will)."""

    devices: Tuple[str, ...] = ("cuda",)  # a CPU kernel runs before step() goes on: nothing to overlap
    min_members: int = 1_000
    min_elements: int = 1 << 24
    first: int = 64
    min_piece: int = 256
    max_pieces: int = 8

    def bounds_of(self, flat_set: "FlatSet") -> Optional[List[int]]:
        """:meth:`bounds`, worked out once per set and policy (neither its members nor its device change)."""
        if flat_set.cuts is None or flat_set.cuts[0] is not self:
            flat_set.cuts = (self, self.bounds(flat_set))
        return flat_set.cuts[1]

    def bounds(self, flat_set: "FlatSet") -> Optional[List[int]]:
        """The end of each piece (member indices), or None when the set is stepped in one call."""
        count = len(flat_set.members)
        if flat_set.weights.device.type not in self.devices or count < max(self.min_members, 2) or \
                flat_set.weights.numel() < self.min_elements:
            return None
        first = min(self.first, count - 1)
        runs = max(1, min(self.max_pieces - 1, (count - first) // max(self.min_piece, 1)))
        size = -(-(count - first) // runs)
        return [first] + list(range(first + size, count, size)) + [count]


@dataclass
class FlatCall:
    """One kernel call of a step: the same element range of a set's buffers and of its flat grad, or of the
    whole buffers and the members' grads where they are (``grads``, each at its member's ``offsets`` entry)."""

    weights: torch.Tensor
    copies: Optional[torch.Tensor]
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    steps: torch.Tensor  # the counters of the range's members
    grad: Optional[torch.Tensor]
    grads: Optional[GradsReadInPlace] = None
    offsets: Optional[torch.Tensor] = None


def call_over(flat_set: "FlatSet", grad: Union[torch.Tensor, GradsReadInPlace], begin: int = 0,
              stop: Optional[int] = None, remember: bool = False) -> FlatCall:
    """The call for members [begin, stop) of ``flat_set`` (all of them by default), ``grad`` its grad buffer,
    or, for all members, their grads read where they are. ``remember`` keeps the range's views of the set's own
    buffers for the next steps (a piece's range is the same every step; the grad buffer's view is made
    each time, as no reference to it may be kept)."""
    count = len(flat_set.members)
    stop = count if stop is None else stop
    if not isinstance(grad, torch.Tensor):
        return FlatCall(flat_set.weights, flat_set.copies, flat_set.exp_avg, flat_set.exp_avg_sq, flat_set.steps,
                        None, grad, flat_set.offsets)
    if begin == 0 and stop == count:
        return FlatCall(flat_set.weights, flat_set.copies, flat_set.exp_avg, flat_set.exp_avg_sq, flat_set.steps, grad)
    first = flat_set.starts[begin]
    length = (flat_set.starts[stop] if stop < count else flat_set.weights.numel()) - first
    views = flat_set.piece_views.get((begin, stop))
    if views is None:
        views = tuple(None if buffer is None else buffer.narrow(0, first, length)
                      for buffer in (flat_set.weights, flat_set.copies, flat_set.exp_avg, flat_set.exp_avg_sq))
        views += (flat_set.steps.narrow(0, begin, stop - begin),)
        if remember:
            flat_set.piece_views[(begin, stop)] = views
    return FlatCall(*views, grad.narrow(0, first, length))


class FlatRun(Protocol):
    """A set's calls for this step, and the members found unfit while they were made (``late``: they take
    the per-tensor path after the calls)."""

    late: Sequence[torch.Tensor]

    def __iter__(self) -> Iterator[FlatCall]: ...


class WholeRun:
    """A set checked in full before the step: one call."""

    __slots__ = ("_calls",)
    late: Tuple[torch.Tensor, ...] = ()

    def __init__(self, call: FlatCall) -> None:
        self._calls = (call,)

    def __iter__(self) -> Iterator[FlatCall]:
        return iter(self._calls)


class PiecewiseRun:
    """A set whose first piece was found in place: each further piece is checked just before its call.
    At the first member that is not in place, the rest of the set takes the full check
    (:func:`flat_grads`: its fresh grads join the buffer, and one call covers the rest), or, when that
    refuses, the per-tensor path (``late``; ``on_rebuild`` hears the reasons that rebuild the layout)."""

    def __init__(self, group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...], flat_set: "FlatSet",
                 bounds: List[int], first_stop: int, grad: torch.Tensor, max_fresh_average: int,
                 on_rebuild: Callable[[int], None]) -> None:
        self._group_params, self._known, self._set = group_params, known, flat_set
        self._bounds, self._first_stop, self._grad = bounds, first_stop, grad
        self._max_fresh_average, self._on_rebuild = max_fresh_average, on_rebuild
        self.late: List[torch.Tensor] = []

    def __iter__(self) -> Iterator[FlatCall]:
        flat_set, grad = self._set, self._grad
        begin, stop = 0, self._first_stop
        for end in self._bounds:
            if begin > 0:
                stop, grad = flat_grads_in_place(self._group_params, self._known, flat_set.members, flat_set.masters,
                                                 flat_set.param_spans, flat_set.offsets, flat_set.grad_like,
                                                 flat_set.weights.numel(), flat_set.grad_start, begin, end, grad)
            if stop > begin:
                yield call_over(flat_set, grad, begin, stop, remember=stop == end)
            if stop < end:
                yield from self._rest(stop)
                return
            begin = end

    def _rest(self, stop: int) -> Iterator[FlatCall]:
        flat_set = self._set
        status, reason, grad = flat_grads(self._group_params, self._known, flat_set.members, flat_set.masters,
                                          flat_set.param_spans, flat_set.offsets, flat_set.grad_like,
                                          flat_set.weights.numel(), flat_set.grad_start, self._max_fresh_average)
        if status == READY:
            flat_set.had_fresh_grads = reason > 0  # (a ready answer's reason: how many grads were fresh)
            yield call_over(flat_set, grad, stop)
            return
        if status == REBUILD:
            self._on_rebuild(reason)
        self.late = list(flat_set.members[stop:])
