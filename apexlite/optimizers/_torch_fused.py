"""FusedAdam with nothing compiled: torch's own fused multi-tensor Adam/AdamW ops.

NOTE [torch fused path]
- ``torch._fused_adam_`` / ``torch._fused_adamw_`` take lists that share one dtype. Every call here
  runs them in float32. When every list is float32 (and the grads may be written), one op call does
  the whole bucket. Otherwise (half grads, half params without masters, bf16 moments, or float32
  grads that must stay as they are) the elements are taken in slices (SLICE_ELEMENTS per device): the
  slice's non-float32 lists are widened into a float32 :class:`Workspace` (one foreach copy per
  list), updated by one op call, and narrowed back (one foreach copy per updated list), and O2 half
  weights (``model_copies``) receive their fp32 masters. That is the upcast + fused + copy chain torch
  users write by hand, with scratch memory bounded by the slice instead of a full fp32 grad copy,
  and reused between steps (a fresh allocation per step costs the CPU a page fault per page).
- Nothing waits for the device: ``grad_scale`` and ``found_inf`` stay tensors on the device, the
  step counters are advanced before the op (it reads the new count) and ``found_inf`` is subtracted
  afterwards, as torch.optim.Adam(fused=True) does. torch's op skips its work only when found_inf is
  exactly 1, so any nonzero flag is first turned into 1 on the device.
- With a ``grad_scale`` torch's op writes grad / grad_scale back into the grads it is given. The
  caller's grads receive them only with ``unscale_grads`` (GradScaler's contract); otherwise they
  are read through the workspace. On a skipped step the widened copies are unchanged, so narrowing
  them back rewrites every tensor with its own bits; only an O2 half weight is rewritten from its
  (unchanged) master, which FusedAdam keeps equal to the weight rounded.
- ``bias_correction=False``: torch's op always corrects; it gets counters holding +inf, for which
  1 - beta**inf is exactly 1.
- Numerics: torch's kernels evaluate the same formula in another order (e.g. its CPU kernel divides
  ``step_size * exp_avg`` by the denominator, its CUDA kernel uses ``beta1 * m + (1 - beta1) * g``
  and divides the grads by the scale), so results agree with apexlite's kernels and reference to
  float32 rounding, not bit for bit.
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import torch

# Elements per slice. CPU: 4 MiB of float32 scratch per widened list, so a slice's widened grads are
# still in cache when the update reads them. GPU: large, so that launches stay few (128 MiB per list).
SLICE_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 25}
DEFAULT_SLICE_ELEMENTS = 1 << 25
OP_NAMES = ("_fused_adam_", "_fused_adamw_")


@functools.lru_cache(maxsize=None)
def available(device_type: str) -> bool:
    """Whether this torch has a fused Adam kernel for ``device_type`` (CPU support came after CUDA's)."""
    if not all(hasattr(torch, name) for name in OP_NAMES):
        return False
    try:
        one = torch.zeros(1, device=device_type)
        torch._fused_adamw_([one], [one.clone()], [one.clone()], [one.clone()], [], [torch.ones((), device=device_type)],
                            lr=0.0, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    except (RuntimeError, NotImplementedError, AssertionError):  # AssertionError: torch built without that device
        return False
    return True


def foreach_copy(targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
    """targets[i].copy_(sources[i]) for all i, in one foreach call where this torch has it."""
    torch_foreach_copy = getattr(torch, "_foreach_copy_", None)
    if torch_foreach_copy is not None:
        torch_foreach_copy(targets, sources)
        return
    for target, source in zip(targets, sources):
        target.copy_(source)


class Workspace:
    """Float32 scratch for the widened lists of one slice, kept between steps (per device and list).

    The views handed out are remembered too: the same slices come back every step, and making 100
    views costs about as much Python time as the rest of the step's bookkeeping.
    """

    def __init__(self) -> None:
        self._buffers: Dict[Tuple[torch.device, int], torch.Tensor] = {}
        self._views: Dict[Tuple[torch.device, int, Tuple[int, ...]], List[torch.Tensor]] = {}

    def pieces(self, device: torch.device, slot: int, sizes: Sequence[int]) -> List[torch.Tensor]:
        """Float32 views of the given sizes, laid end to end in the buffer of ``slot``."""
        key = (device, slot, tuple(sizes))
        views = self._views.get(key)
        if views is not None:
            return views
        total = sum(sizes)
        buffer = self._buffers.get((device, slot))
        if buffer is None or buffer.numel() < total:
            buffer = self._buffers[(device, slot)] = torch.empty(total, dtype=torch.float32, device=device)
            self._views = {k: v for k, v in self._views.items() if k[:2] != (device, slot)}  # of the old buffer
        views = self._views[key] = list(buffer[:total].split(list(sizes)))
        return views


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The elements of a dense tensor in memory order (lists of one call share their strides)."""
    if tensor.dim() == 1:
        return tensor
    return tensor.view(-1) if tensor.is_contiguous() else tensor.as_strided((tensor.numel(),), (1,))


def _piece(flat: torch.Tensor, start: int, end: int) -> torch.Tensor:
    return flat if start == 0 and end == flat.numel() else flat[start:end]


def _slices(numels: Sequence[int], limit: int) -> List[List[Tuple[int, int, int]]]:
    """(tensor index, start, end) pieces grouped into slices of at most ``limit`` elements.

    A tensor is cut only when it alone exceeds ``limit``: every extra piece costs the CPU one more
    parallel region in each of the slice's three ops.
    """
    slices: List[List[Tuple[int, int, int]]] = []
    current: List[Tuple[int, int, int]] = []
    room = limit
    for index, numel in enumerate(numels):
        if numel == 0:
            continue
        if numel > room and current:
            slices.append(current)
            current, room = [], limit
        if numel > limit:
            slices += [[(index, start, min(start + limit, numel))] for start in range(0, numel, limit)]
            continue
        current.append((index, 0, numel))
        room -= numel
    return slices + ([current] if current else [])


def torch_fused_adam_step(
    params: List[torch.Tensor],
    grads: List[torch.Tensor],
    exp_avgs: List[torch.Tensor],
    exp_avg_sqs: List[torch.Tensor],
    state_steps: List[torch.Tensor],
    model_copies: List[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    bias_correction: bool,
    adam_w_mode: bool,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
    unscale_grads: bool = False,
    workspace: Optional[Workspace] = None,
    counters: Optional[List[torch.Tensor]] = None,
) -> None:
    """The ``apexlite::fused_adam_`` contract on torch's fused ops (see NOTE [torch fused path]).

    ``workspace`` keeps the scratch memory for the next call (FusedAdam passes its own); without
    one the scratch is allocated for this call only. ``counters`` are the tensors the step advances
    when they are not ``state_steps`` themselves (flat buffers: all of a set's counters, of which
    ``state_steps`` holds the first).
    """
    if not params:
        return
    device = params[0].device
    if found_inf is not None:
        found_inf = (found_inf != 0).to(torch.float32).reshape(())
    # AdamW with no decay is Adam; torch's Adam kernel skips the decay multiply altogether
    op = torch._fused_adamw_ if adam_w_mode and weight_decay != 0 else torch._fused_adam_
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False,
                 grad_scale=grad_scale, found_inf=found_inf)
    counters = state_steps if counters is None else counters
    torch._foreach_add_(counters, 1.0)
    steps = state_steps
    if not bias_correction:
        steps = [torch.full((), float("inf"), device=device)] * len(params)
    lists = (params, grads, exp_avgs, exp_avg_sqs)
    scratch = [lst[0].dtype != torch.float32 for lst in lists]
    scratch[1] = scratch[1] or (grad_scale is not None and not unscale_grads)  # the caller's grads stay as they are
    if not any(scratch):
        op(*lists, [], steps, **hyper)
        if model_copies:
            foreach_copy(model_copies, params)
    else:
        _sliced_step(op, hyper, lists, scratch, steps, model_copies, workspace or Workspace(),
                     write_grads=grad_scale is not None and unscale_grads)
    if found_inf is not None:
        torch._foreach_sub_(counters, [found_inf] * len(counters))


def _sliced_step(op, hyper: dict, lists, scratch: List[bool], steps: List[torch.Tensor],
                 model_copies: List[torch.Tensor], workspace: Workspace, write_grads: bool) -> None:
    """The step slice by slice, with the lists marked in ``scratch`` widened into ``workspace``."""
    flat_lists = [[_flat(t) for t in lst] for lst in lists]
    flat_copies = [_flat(t) for t in model_copies]
    device = lists[0][0].device
    limit = SLICE_ELEMENTS.get(device.type, DEFAULT_SLICE_ELEMENTS)
    for pieces in _slices([t.numel() for t in lists[0]], limit):
        views = [[_piece(flat[i], start, end) for i, start, end in pieces] for flat in flat_lists]
        work = []
        for slot, (piece_views, widen) in enumerate(zip(views, scratch)):
            if widen:
                widened = workspace.pieces(device, slot, [view.numel() for view in piece_views])
                foreach_copy(widened, piece_views)
                piece_views = widened
            work.append(piece_views)
        op(*work, [], [steps[i] for i, _, _ in pieces], **hyper)
        for slot in (0, 2, 3):
            if scratch[slot]:
                foreach_copy(views[slot], work[slot])
        if scratch[1] and write_grads:
            foreach_copy(views[1], work[1])
        if flat_copies:
            foreach_copy([_piece(flat_copies[i], start, end) for i, start, end in pieces], work[0])
