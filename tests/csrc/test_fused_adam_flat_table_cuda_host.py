"""The CUDA table kernel's own source (csrc/cuda/fused_adam_flat_table.cu: fused_adam_flat_grad_list_ on a
GPU, each grad read where it is), run on the CPU through the host emulation (marker ``cuda_host``; see
tests/csrc/emulated_cuda.py and csrc/cuda/host_emulation.h).

Checked: bit-identical results to the compiled CPU op (which its own tests pin to the flat op), for every
dtype combination, both Adam modes, with and without ``grad_scale`` (the unscaled grads written back into
each grad), with grads placed so their runs take vectors from the first element, vectors after a head, or
no vectors at all, and grads longer than one table chunk; every call is two launches (the update, a grid
of at most one wave walking the table, and the counters) whatever the number of grads; every element in
a range moves exactly once and the elements between ranges not at all; ``found_inf`` writes nothing.
Every buffer and grad lies between guard bands.
"""
from __future__ import annotations

from typing import List

import pytest
import torch

from apexlite._native import loader as _ext
from tests.csrc import emulated_cuda
from tests.csrc.test_fused_adam_cuda_host import COUNTING, GUARD, GUARD_VALUE, HYPER
from tests.csrc.test_fused_adam_flat_cuda_host import BLOCK, GRID_LIMIT, VEC, GuardedFlat, _assert_bitwise_equal
from tests.csrc.test_fused_adam_flat_op import DTYPE_COMBOS, tensor_lists

pytestmark = [
    pytest.mark.cuda_host,
    pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel (the oracle) not built"),
]

CHUNK = 1 << 14  # kGradChunkElems, launchers.h
# odd sizes, a grad of three chunks' runs (the last partial), one of exactly two chunks and a tail
NUMELS = [5, 1, 2 * CHUNK + 1000, 3, 2 * CHUNK, 9]
# placement -> (range starts rounded up to vector boundaries?, each grad's shift past a boundary as a
# function of its range's start)
PLACEMENTS = {
    "vector-loads": (True, lambda start: 0),
    "common-head": (False, lambda start: start % VEC),  # grad and buffers equally far from a boundary
    "unequal": (False, lambda start: (start + 1) % VEC),  # no common boundary: one element at a time
}


@pytest.fixture(scope="module")
def emulated():
    return emulated_cuda.kernels_or_skip()


def _offsets(numels, aligned: bool) -> torch.Tensor:
    starts, at = [], 0
    for n in numels:
        at = -(-at // VEC) * VEC if aligned else at
        starts.append(at)
        at += n
    return torch.tensor(starts, dtype=torch.int64)


def _spread(tensors: List[torch.Tensor], offsets: torch.Tensor, fill: float) -> torch.Tensor:
    """One buffer holding each tensor at its offset and `fill` between them."""
    total = int(offsets[-1]) + tensors[-1].numel()
    buffer = torch.full((total,), fill, dtype=tensors[0].dtype)
    for start, tensor in zip(offsets.tolist(), tensors):
        buffer[start:start + tensor.numel()] = tensor
    return buffer


class GuardedGrads:
    """Each grad `shift(its start)` elements past a guard band in a tensor of its own; guards checked after."""

    def __init__(self, grads: List[torch.Tensor], offsets: torch.Tensor, shift) -> None:
        self.grads, self._guards = [], []
        for grad, start in zip(grads, offsets.tolist()):
            begin = GUARD + shift(start)
            whole = torch.full((begin + grad.numel() + GUARD,), GUARD_VALUE, dtype=grad.dtype)
            self.grads.append(whole[begin:begin + grad.numel()].copy_(grad))
            self._guards += [whole[:begin], whole[begin + grad.numel():]]

    def assert_guards_intact(self) -> None:
        for index, guard in enumerate(self._guards):
            assert bool((guard == GUARD_VALUE).all()), f"guard band {index} around the grads written"


def _case(numels, combo, placement):
    """(the CPU op's buffers, grads and offsets; the emulation's guarded buffers and guarded grads)."""
    aligned, shift = PLACEMENTS[placement]
    offsets = _offsets(numels, aligned)
    params, grads, exp_avgs, exp_avg_sqs, steps, copies = tensor_lists(numels, combo)
    flat = [_spread(params, offsets, 0.5), None, _spread(exp_avgs, offsets, 0.25), _spread(exp_avg_sqs, offsets, 0.125),
            torch.stack(steps), _spread(copies, offsets, 2.0) if copies else None]
    expected = [None if t is None else t.clone() for t in flat]
    return (expected, [g.clone() for g in grads], offsets), (GuardedFlat(flat, (0,) * 6), GuardedGrads(grads, offsets, shift))


def _run(op, buffers, grads, offsets, **kwargs):
    param, _, exp_avg, exp_avg_sq, steps, copy = buffers
    op(param, grads, offsets, exp_avg, exp_avg_sq, steps, copy, **kwargs)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("scaling", ["unscaled", "scaled-and-unscale-grads", "scaled-keep-grads"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_emulated_table_kernel_matches_cpu_op_bit_for_bit(emulated, combo, adam_w_mode, scaling, placement):
    (expected, expected_grads, offsets), (guarded, guarded_grads) = _case(NUMELS, combo, placement)
    scale = None if scaling == "unscaled" else torch.tensor([3.0 if scaling == "scaled-keep-grads" else 65536.0])
    kwargs = dict(HYPER, adam_w_mode=adam_w_mode, grad_scale=scale, unscale_grads=scaling != "scaled-keep-grads")
    _run(torch.ops.apexlite.fused_adam_flat_grad_list_, expected, expected_grads, offsets, **kwargs)
    emulated.take_launches()
    _run(emulated.fused_adam_flat_grad_list_, guarded.buffers, guarded_grads.grads, offsets, **kwargs)
    _assert_bitwise_equal(guarded.buffers, expected)
    _assert_bitwise_equal(guarded_grads.grads, expected_grads)
    guarded.assert_guards_intact()
    guarded_grads.assert_guards_intact()
    entries = sum(-(-n // CHUNK) for n in NUMELS)
    assert emulated.take_launches() == [(min(entries, GRID_LIMIT), BLOCK), (1, BLOCK)]


@pytest.mark.parametrize("numels", [[1], [3] * 50, [7] * 300, [4 * CHUNK + 5], [2000] * 9 + [1] * 600],
                         ids=["one", "fifty", "three-hundred", "one-of-five-runs", "nine-long-600-short"])
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_two_launches_and_every_element_moves_exactly_once(emulated, numels, placement):
    """A zero weight with gradient 1 moves by exactly -1 per update (COUNTING); the filler between ranges stays."""
    combo = (torch.bfloat16, torch.bfloat16, torch.bfloat16, None)
    (_, _, offsets), (guarded, guarded_grads) = _case(numels, combo, placement)
    param, _, _, _, steps, _ = guarded.buffers
    for start, grad in zip(offsets.tolist(), guarded_grads.grads):
        param[start:start + grad.numel()] = 0.0
        grad.fill_(1.0)
    steps.fill_(5.0)
    emulated.take_launches()
    _run(emulated.fused_adam_flat_grad_list_, guarded.buffers, guarded_grads.grads, offsets, **COUNTING,
         adam_w_mode=True)
    inside = torch.zeros(param.numel(), dtype=torch.bool)
    for start, grad in zip(offsets.tolist(), guarded_grads.grads):
        inside[start:start + grad.numel()] = True
    assert bool((param[inside] == -1).all()), "an element in a range did not move by exactly one update"
    assert bool((param[~inside] == 0.5).all()), "an element between ranges was written"
    assert torch.equal(steps, torch.full((len(numels),), 6.0))
    guarded.assert_guards_intact()
    guarded_grads.assert_guards_intact()
    entries = sum(-(-n // CHUNK) for n in numels)
    assert emulated.take_launches() == [(min(entries, GRID_LIMIT), BLOCK), (-(-len(numels) // BLOCK), BLOCK)]


@pytest.mark.parametrize("found_inf", [1.0, float("inf")])
def test_found_inf_writes_nothing_and_keeps_counters(emulated, found_inf):
    _, (guarded, guarded_grads) = _case(NUMELS, (torch.float32, torch.float16, torch.float32, torch.float16),
                                         "common-head")
    offsets = _offsets(NUMELS, False)
    before = [None if t is None else t.clone() for t in guarded.buffers]
    grads_before = [g.clone() for g in guarded_grads.grads]
    _run(emulated.fused_adam_flat_grad_list_, guarded.buffers, guarded_grads.grads, offsets, **HYPER,
         adam_w_mode=True, grad_scale=torch.tensor([8.0]), found_inf=torch.tensor([found_inf]), unscale_grads=True)
    _assert_bitwise_equal(guarded.buffers, before)
    _assert_bitwise_equal(guarded_grads.grads, grads_before)


def test_fp16_moments_are_a_launch_error(emulated):
    (buffers, grads, offsets), _ = _case([4, 4], (torch.float32, torch.float32, torch.float32, None), "vector-loads")
    buffers[2], buffers[3] = buffers[2].half(), buffers[3].half()
    with pytest.raises(RuntimeError, match="cudaError 1"):
        _run(emulated.fused_adam_flat_grad_list_, buffers, grads, offsets, **HYPER, adam_w_mode=True)
