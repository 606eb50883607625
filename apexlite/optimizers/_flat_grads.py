"""How a FusedAdam flat buffer set gets its gradients each step, and how zero_grad clears them: NOTE [flat grads].

NOTE [flat grads]
- autograd adds into a param's existing ``.grad`` in place, and writes a fresh tensor when ``.grad``
  is None (after ``zero_grad(set_to_none=True)``, torch's and FusedAdam's default; amp O2 clears
  them before each backward too).
- A step whose members' grads all live in one grad buffer of the set's layout runs on that buffer:
  nothing is copied. The compiled check looks for that case first, in a tight loop on the calling thread
  (csrc/torch/member_scan.cpp, which says why not on the intra-op threads). Fresh grads are copied into the
  buffer (one pass over them: memcpy on the CPU,
  one launch of apexlite::flat_gather_ on a GPU, its table built in one C++ loop) and each grad
  tensor is then re-pointed into it: the same Python object with the same shape, strides and values,
  only its storage moves. So ``.grad`` keeps its identity (GradScaler's contract: the unscaled grads
  land in the tensors ``.grad`` holds), a later backward that adds into it (gradient accumulation,
  ``zero_grad(set_to_none=False)``) writes the buffer, and the next step copies nothing.
- No reference to the grad buffer is kept here: the grads hold it, and grads set to None free it
  with them, so memory is what it would be without flat buffers.
- A fresh grad moves only when no other tensor shares its memory (not a view such as DDP's bucket
  views, not made by ``.detach()``/``.data``); the buffer takes fresh grads only when no tensor but
  the member grads references it (a grad a caller kept from an earlier step keeps its values), else
  all grads move to a new buffer.
- Fresh grads again right after a step that found fresh grads (a zero_grad(set_to_none=True) loop,
  where a copy would be paid every step, into a new buffer) are read where they are when apexlite's
  kernels step the set (READ_FRESH): ``apexlite::fused_adam_flat_grad_list_`` takes the flat buffers and
  the grads (on a GPU one launch whatever their number, over a table of the grads' runs handed to the
  device each step; on the CPU one pass over the same table), and nothing is copied or re-pointed. The C++
  check hands them over as apexlite._C.GradList, C++ tensors: autograd's grads never get a Python object
  (which cost about 100 ns a grad to make, more to free, and garbage-collector passes over them). So the
  first step of a set_to_none loop moves its grads (a loop that then keeps them copies nothing from then
  on) and the later ones read them in place; once read in place, kept grads are read there too (they are
  not in the buffer). Grads of any size are read so: handing a grad over costs about 30-70 ns on the
  CPU (a table entry on a GPU), and autograd's grads moved into the buffer cost more than that to copy and
  re-point even at 1 to 16 floats (2,000 such grads, step + zero_grad on the CI VM, one thread: 1.5-1.7 ms
  read in place, 1.7-2.5 moved).
- Fresh grads that cannot move (views of another tensor: the unbound grads of a stacked tensor, DDP's
  bucket views; memory other tensors share) are read where they are whenever apexlite's kernels step the
  set, from the first step, as long as no two grads share an element and none lies in the grad buffer
  (the kernels may write the unscaled grads back) and each is plain memory holding its values (no Python
  subclass, no lazy negation). Otherwise, and always on torch's fused ops, the set takes the per-tensor
  path (2,000 views of 16 floats, step + zero_grad on the CI VM, one thread: 6.7 ms per tensor, 0.65 ms
  read in place).
- On the CPU, fresh grads averaging more than MAX_FRESH_AVERAGE_CPU elements are not copied even once
  (READ_LARGE_FRESH): the copy costs about 0.5 ns an element, and a new CPU buffer may cost a page fault
  per 4 KB page besides (about 3.2 ns an element; in bench_adam_tensor_counts' rounds about 3,900 faults
  a step at 1,000 x 4,000 floats). Without apexlite's kernels (torch's fused ops need one grad buffer)
  such grads take the per-tensor path, at about 6.5 us a tensor, and fresh grads right after a step
  that moved fresh grads move again only up to MAX_FRESH_AVERAGE_CPU_AGAIN elements on average. On a
  GPU the caching allocator hands a buffer out at no cost and the copy runs at memory speed.
- Anything else sends the set down the per-tensor path for this step, with a reason (REASONS). A
  missing grad, a grad of another dtype, a replaced param or a changed param list also ask for the
  layout to be rebuilt (the step counters of the set may now differ; the buffers follow the params).

- A large set on a GPU is checked and stepped in pieces (:func:`flat_grads_in_place`, used by
  _flat_runs.py): while every member so far is exactly as the set left it (param in place, grad in
  place in the buffer), each checked piece is launched at once, so the device works while the host
  checks the next. At the first member that is not, the rest of the set takes the full check (one
  launch, fresh grads moved in) or the per-tensor path, whose grads are validated after the pieces
  before them have stepped: an error there leaves those pieces stepped.

- zero_grad (:func:`flat_zero_grads`) clears a set in one pass too: set_to_none drops each member's
  grad; kept grads that all lie in the set's grad buffer are zeroed by one fill, each grad's version
  advanced; anything else is left to torch's per-param rule.

The passes are ``apexlite._C.flat_grads`` and ``flat_zero_grads`` (csrc/torch/flat_grads.cpp: no Python
per param) when the compiled library is loaded, else their Python twins, the same logic at Python speed.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from apexlite._native import loader as _ext
from apexlite.optimizers._adam_step import bump_versions
from apexlite.optimizers._grad_checks import any_shared, lies_at, movable, readable, same_layout, use_count

READY, LIST_PATH, REBUILD, READ_IN_PLACE = 0, 1, 2, 3
# grad_reads: when fresh grads are read where they are (apexlite::fused_adam_flat_grad_list_) instead of
# moving into the grad buffer; as GradReads in csrc/torch/flat_grads.cpp
MOVE_FRESH, READ_LARGE_FRESH, READ_FRESH = 0, 1, 2
MAX_FRESH_AVERAGE_CPU = 8192  # elements: about where copying a fresh grad costs what the per-tensor path does
MAX_FRESH_AVERAGE_CPU_AGAIN = 2048  # the same right after a step that moved fresh grads: a zero_grad(set_to_none) loop
# indexed by the reason codes of csrc/torch/member_scan.h
REASONS = (
    "",
    "the group's params list changed",
    "a param's data moved or changed size (its .data was replaced)",
    "a param has no grad",
    "a grad's dtype differs from the buffer's",
    "a master weight holds its own grad (amp O2 with clipping or accumulation)",
    "a grad is laid out unlike its param, sparse or on another device",
    "a grad shares its memory with other tensors",
    "fresh grads this large are cheaper to read in place than to copy (CPU)",
)
GROUP_CHANGED, PARAM_MOVED, MISSING_GRAD, GRAD_DTYPE, MASTER_GRAD, ODD_GRAD, SHARED_GRAD, LARGE_FRESH_GRADS = range(1, 9)
_REBUILD_REASONS = (GROUP_CHANGED, PARAM_MOVED, MISSING_GRAD, GRAD_DTYPE)

# Grads read where they are: a tuple of tensors (the Python twin's), or apexlite._C.GradList (the C++
# check's: the grads as C++ tensors, so autograd's grads never get a Python object).
GradsReadInPlace = Any
Verdict = Tuple[int, int, Any]  # (status, reason or fresh count, flat grad / GradsReadInPlace / None)


def fresh_grad_policy(device: torch.device, kernel: bool, fresh_last_step: bool) -> Tuple[int, int]:
    """(max_fresh_average, grad_reads) for :func:`flat_grads`: what fresh grads do on ``device``, with or
    without apexlite's kernels, right after a step that found fresh grads or not (the note above)."""
    cpu = device.type == "cpu"
    if kernel:
        return (MAX_FRESH_AVERAGE_CPU if cpu else 0), (READ_FRESH if fresh_last_step else READ_LARGE_FRESH)
    return (0 if not cpu else MAX_FRESH_AVERAGE_CPU_AGAIN if fresh_last_step else MAX_FRESH_AVERAGE_CPU), MOVE_FRESH


def _verdict(reason: int) -> Verdict:
    return (REBUILD if reason in _REBUILD_REASONS else LIST_PATH), reason, None


def python_flat_grads(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
                      members: Tuple[torch.Tensor, ...], masters: Optional[Tuple[torch.Tensor, ...]],
                      param_spans: torch.Tensor, offsets: torch.Tensor, grad_like: torch.Tensor, total: int,
                      shift: int, max_fresh_average: int, grad_reads: int) -> Verdict:
    """apexlite._C.flat_grads in Python (see :func:`flat_grads`).
    The grad buffer is ``total`` elements from element ``shift`` of its storage; ``offsets`` are in it."""
    if len(group_params) != len(known) or any(a is not b for a, b in zip(group_params, known)):
        return _verdict(GROUP_CHANGED)
    expected, starts = param_spans.tolist(), [shift + offset for offset in offsets.tolist()]
    buffer: Optional[torch.UntypedStorage] = None
    grads: List[torch.Tensor] = []
    in_place: List[bool] = []
    pinned: List[torch.Tensor] = []  # fresh grads that cannot move (kernels that read grads in place only)
    reason = 0
    for i, param in enumerate(members):
        if param.data_ptr() != expected[i][0] or param.numel() != expected[i][1]:
            return _verdict(PARAM_MOVED)
        grad = param.grad
        if grad is None:
            return _verdict(MISSING_GRAD)
        if grad.dtype != grad_like.dtype:
            return _verdict(GRAD_DTYPE)
        if masters is not None and masters[i].grad is not None:
            reason = reason or MASTER_GRAD
        elif grad.layout != torch.strided or grad.device != param.device or not same_layout(grad, param):
            reason = reason or ODD_GRAD
        if reason:
            continue
        storage = grad.untyped_storage()
        if buffer is None and grad.storage_offset() == starts[i] and \
                storage.nbytes() == (shift + total) * grad.element_size():
            buffer = storage
        mine = buffer is not None and storage._cdata == buffer._cdata
        if mine and grad.storage_offset() != starts[i]:
            reason = ODD_GRAD  # the buffer in another layout
        elif not mine and not movable(grad):
            if grad_reads == MOVE_FRESH or not readable(grad):
                reason = SHARED_GRAD
            else:
                pinned.append(grad)  # fresh, and can only be read where it is
        grads.append(grad)
        in_place.append(mine)
    if reason:
        return _verdict(reason)
    if pinned and any_shared(pinned, buffer):
        return _verdict(SHARED_GRAD)
    fresh = [grad.numel() for grad, mine in zip(grads, in_place) if not mine]
    fresh_elements = sum(fresh)
    large = max_fresh_average > 0 and fresh_elements > max_fresh_average * len(fresh)
    if pinned or (fresh and (grad_reads == READ_FRESH or (large and grad_reads != MOVE_FRESH))):
        bump_versions(members)  # the kernel writes them through raw pointers
        return READ_IN_PLACE, len(fresh), tuple(grads)
    if large:
        return _verdict(LARGE_FRESH_GRADS)
    storage = None  # (a handle of its own would count as a user of the buffer)
    everyone = all(in_place)
    reuse = buffer is not None and (everyone or use_count(buffer) == sum(in_place) + 1)
    if not reuse:
        buffer = torch.empty(shift + total, dtype=grad_like.dtype, device=grad_like.device).untyped_storage()
    flat = torch.empty(0, dtype=grad_like.dtype, device=grad_like.device).set_(buffer, shift, (total,), (1,))
    moving = [i for i, mine in enumerate(in_place) if not (reuse and mine)]
    if moving:
        sources = [grads[i].as_strided((grads[i].numel(),), (1,)) for i in moving]
        torch._foreach_copy_([flat.as_strided((grads[i].numel(),), (1,), starts[i]) for i in moving], sources)
        for i in moving:
            grads[i].set_(flat.untyped_storage(), starts[i], grads[i].shape, grads[i].stride())
    bump_versions(members)  # the kernel writes them through raw pointers
    return READY, len(moving), flat


def python_flat_grads_in_place(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
                               members: Tuple[torch.Tensor, ...], masters: Optional[Tuple[torch.Tensor, ...]],
                               param_spans: torch.Tensor, offsets: torch.Tensor, grad_like: torch.Tensor, total: int,
                               shift: int, begin: int, end: int,
                               flat: Optional[torch.Tensor]) -> Tuple[int, Optional[torch.Tensor]]:
    """apexlite._C.flat_grads_in_place in Python: see :func:`flat_grads_in_place`."""
    if not 0 <= begin <= end <= len(members):
        raise ValueError(f"members [{begin}, {end}) is no range of the {len(members)} members")
    if begin == 0 and (len(group_params) != len(known) or any(a is not b for a, b in zip(group_params, known))):
        return -1, None
    expected, starts = param_spans.tolist(), [shift + offset for offset in offsets.tolist()]
    buffer = None if flat is None else flat.untyped_storage()
    stop = begin
    while stop < end:
        param = members[stop]
        grad = param.grad
        if param.data_ptr() != expected[stop][0] or param.numel() != expected[stop][1] or \
                not lies_at(grad, param, grad_like.dtype, starts[stop]) or \
                (masters is not None and masters[stop].grad is not None):
            break
        storage = grad.untyped_storage()
        if buffer is None:
            if storage.nbytes() != (shift + total) * grad.element_size():
                break
            buffer = storage
        elif storage._cdata != buffer._cdata:
            break
        stop += 1
    bump_versions(members[begin:stop])
    if flat is None and buffer is not None:
        flat = torch.empty(0, dtype=grad_like.dtype, device=grad_like.device).set_(buffer, shift, (total,), (1,))
    return stop, flat


ZEROED, NOT_IN_BUFFER, PARAMS_CHANGED = 0, 1, 2  # flat_zero_grads' answers


def python_flat_zero_grads(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
                           members: Tuple[torch.Tensor, ...], offsets: torch.Tensor, grad_like: torch.Tensor,
                           total: int, shift: int, set_to_none: bool) -> int:
    """apexlite._C.flat_zero_grads in Python: zero_grad for one set (see :func:`flat_zero_grads`)."""
    if len(group_params) != len(known) or any(a is not b for a, b in zip(group_params, known)):
        return PARAMS_CHANGED
    if set_to_none:
        for param in members:
            param.grad = None
        return ZEROED
    buffer: Optional[torch.UntypedStorage] = None
    for param, start in zip(members, (shift + offset for offset in offsets.tolist())):
        grad = param.grad
        if not lies_at(grad, param, grad_like.dtype, start) or grad.requires_grad:
            return NOT_IN_BUFFER
        storage = grad.untyped_storage()
        if buffer is None and storage.nbytes() == (shift + total) * grad.element_size():
            buffer = storage
        if buffer is None or storage._cdata != buffer._cdata:
            return NOT_IN_BUFFER
    if buffer is None:
        return ZEROED
    torch.empty(0, dtype=grad_like.dtype, device=grad_like.device).set_(buffer, shift, (total,), (1,)).zero_()
    bump_versions([param.grad for param in members])
    return ZEROED


@functools.lru_cache(maxsize=None)
def _native(name: str) -> Optional[Callable[..., Any]]:
    """apexlite._C's function ``name``, or None when the compiled library is not loaded."""
    module = _ext.native_module()
    return getattr(module, name, None) if module is not None else None


def flat_grads(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
               members: Tuple[torch.Tensor, ...], masters: Optional[Tuple[torch.Tensor, ...]],
               param_spans: torch.Tensor, offsets: torch.Tensor, grad_like: torch.Tensor, total: int,
               shift: int, max_fresh_average: int = 0, grad_reads: int = MOVE_FRESH) -> Verdict:
    """(status, reason, grads): READY with the set's grads as one flat tensor (fresh ones moved into it)
    and, in the reason's place, how many grads moved; READ_IN_PLACE (fresh grads that ``grad_reads``
    says to read where they are, or that cannot move) with the grads (GradsReadInPlace), one per member,
    and how many were fresh;
    or LIST_PATH / REBUILD with an index into REASONS and None. Member versions are bumped when
    ready; otherwise nothing changed but, maybe, version counters (a bump too many is harmless; the
    per-tensor path bumps them)."""
    native = _native("flat_grads")
    run = native if native is not None else python_flat_grads
    return run(group_params, known, members, masters, param_spans, offsets, grad_like, total, shift, max_fresh_average,
               grad_reads)


def flat_grads_in_place(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
                        members: Tuple[torch.Tensor, ...], masters: Optional[Tuple[torch.Tensor, ...]],
                        param_spans: torch.Tensor, offsets: torch.Tensor, grad_like: torch.Tensor, total: int,
                        shift: int, begin: int, end: int,
                        flat: Optional[torch.Tensor]) -> Tuple[int, Optional[torch.Tensor]]:
    """The check of one piece of a set stepped in pieces: (stop, flat grad). Members [begin, stop) have their
    params where the set put them and their grads in place in the grad buffer (``flat``, or when None the
    storage the first one's grad lies in), with no master grad; their versions are bumped. ``flat`` comes
    back as the grad buffer (None when no member passed and none was given); stop is -1 when ``begin`` is 0
    and the group's params list is not ``known``. Nothing else changes."""
    native = _native("flat_grads_in_place")
    run = native if native is not None else python_flat_grads_in_place
    return run(group_params, known, members, masters, param_spans, offsets, grad_like, total, shift, begin, end, flat)


def flat_zero_grads(group_params: Sequence[torch.Tensor], known: Tuple[torch.Tensor, ...],
                    members: Tuple[torch.Tensor, ...], offsets: torch.Tensor, grad_like: torch.Tensor, total: int,
                    shift: int, set_to_none: bool) -> int:
    """zero_grad for one flat set, with no Python per member when the library is loaded: ZEROED (each
    grad dropped as ``p.grad = None`` does, or, kept, the grad buffer zeroed in one fill and each grad's
    version advanced as ``grad.zero_()`` would; the params' versions are left alone, so a zero_grad between
    forward and backward stays legal), NOT_IN_BUFFER (some grad is missing or lives elsewhere: clear
    them one by one) or PARAMS_CHANGED (the group's params list is not the one the set was built from)."""
    native = _native("flat_zero_grads")
    run = native if native is not None else python_flat_zero_grads
    return run(group_params, known, members, offsets, grad_like, total, shift, set_to_none)
