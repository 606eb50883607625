"""The CUDA flat kernel's own source (csrc/cuda/fused_adam_flat.cu), run on the CPU through the host
emulation (marker ``cuda_host``; see tests/csrc/emulated_cuda.py and csrc/cuda/host_emulation.h).

Checked: bit-identical results to the compiled CPU kernel, which the list tests pin to the list op,
for every dtype combination the op accepts, both Adam modes, with and without ``grad_scale``, on
buffers whose addresses allow the vector loads, on buffers that all start the same number of elements
past a vector boundary (a range of a set's buffers: a scalar head, then vectors) and on buffers that
start at different distances from one (no vectors at all), every element once on each path;
``found_inf`` writes nothing; every call is exactly two launches (the update over the
whole buffers, grid-stride, and the counters), whatever the number of params the buffers hold; and
the grid-stride loop and vector tails update every element exactly once (counting hyper-parameters:
a zero weight with gradient 1 moves by exactly -1 per update). Every buffer lies between guard bands.
"""
from __future__ import annotations

from typing import List, Optional

import pytest
import torch

from apexlite._native import loader as _ext
from tests.csrc import emulated_cuda
from tests.csrc.test_fused_adam_cuda_host import COUNTING, GUARD, GUARD_VALUE, HYPER
from tests.csrc.test_fused_adam_flat_op import DTYPE_COMBOS, _bits, flat_of, tensor_lists

pytestmark = [
    pytest.mark.cuda_host,
    pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel (the oracle) not built"),
]

BLOCK, VEC = 256, 8  # fused_adam_flat.cu
EMULATED_SMS, EMULATED_BLOCKS_PER_SM = 4, 2  # host_emulation.h
GRID_LIMIT = EMULATED_SMS * EMULATED_BLOCKS_PER_SM  # one wave
# a buffer of 3 full grid turns of vectors and a 5-element tail; 17 params of it, so counters span launches' blocks
NUMELS = [3, 1000, 3 * GRID_LIMIT * BLOCK * VEC - 1000 - 3 + 5 - 13 * 7] + [7] * 13


@pytest.fixture(scope="module")
def emulated():
    return emulated_cuda.kernels_or_skip()


# placement -> each buffer's shift in elements past a vector boundary (param, grad, exp_avg, exp_avg_sq, copy)
PLACEMENTS = {
    "vector-loads": (0, 0, 0, 0, 0),
    "common-head": (3, 3, 3, 3, 3),  # 5 elements one at a time, then vectors
    "unequal": (1, 1, 2, 1, 1),  # no shift brings every buffer to a boundary: all one at a time
}


def _shifts(placement):
    return PLACEMENTS[placement][:4] + (None,) + PLACEMENTS[placement][4:]


def _units(total: int, placement: str) -> int:
    """What the launch's grid is sized by: vectors after the head, or single elements."""
    if placement == "unequal":
        return total
    head = min((VEC - PLACEMENTS[placement][0]) % VEC, total)
    return (total - head) // VEC


class GuardedFlat:
    """Each buffer placed its shift in elements past a guard band in a larger tensor (``shifts``: one per
    buffer, the counters' entry unused; a shift that is not a multiple of the vector width puts the
    buffer off a vector boundary); guards checked after."""

    def __init__(self, flat: List[Optional[torch.Tensor]], shifts) -> None:
        self.buffers: List[Optional[torch.Tensor]] = []
        self._guards: List[torch.Tensor] = []
        for index, (buffer, shift) in enumerate(zip(flat, shifts)):
            if buffer is None or index == 4:  # counters stay as they are
                self.buffers.append(buffer)
                continue
            start = GUARD + shift
            whole = torch.full((start + buffer.numel() + GUARD,), GUARD_VALUE, dtype=buffer.dtype)
            self.buffers.append(whole[start:start + buffer.numel()].copy_(buffer))
            self._guards += [whole[:start], whole[start + buffer.numel():]]

    def assert_guards_intact(self) -> None:
        for index, guard in enumerate(self._guards):
            written = (guard != GUARD_VALUE).nonzero().flatten()
            assert written.numel() == 0, f"guard band {index} written at offsets {written[:5].tolist()}"


def _assert_bitwise_equal(actual, expected):
    for index, (got, want) in enumerate(zip(actual, expected)):
        if want is None:
            continue
        differ = (_bits(got) != _bits(want)).nonzero().flatten()
        assert differ.numel() == 0, f"buffer {index} differs from the CPU kernel at {differ[:5].tolist()}"


def _blocks(units: int) -> int:
    return max(1, min(-(-units // BLOCK), GRID_LIMIT))


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("scaling", ["unscaled", "scaled-and-unscale-grads", "scaled-keep-grads"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_emulated_flat_kernel_matches_cpu_kernel_bit_for_bit(emulated, combo, adam_w_mode, scaling, placement):
    expected = flat_of(tensor_lists(NUMELS, combo))
    guarded = GuardedFlat(flat_of(tensor_lists(NUMELS, combo)), _shifts(placement))
    scale = None if scaling == "unscaled" else torch.tensor([3.0 if scaling == "scaled-keep-grads" else 65536.0])
    kwargs = dict(HYPER, adam_w_mode=adam_w_mode, grad_scale=scale, unscale_grads=scaling != "scaled-keep-grads")
    emulated.take_launches()
    torch.ops.apexlite.fused_adam_flat_(*expected, **kwargs)
    emulated.fused_adam_flat_(*guarded.buffers, **kwargs)
    _assert_bitwise_equal(guarded.buffers, expected)
    guarded.assert_guards_intact()
    assert emulated.take_launches() == [(_blocks(_units(sum(NUMELS), placement)), BLOCK), (1, BLOCK)]


@pytest.mark.parametrize("numels", [[1], [4], [7], [8], [9], [2000], [BLOCK * VEC * GRID_LIMIT * 2 + 3] + [1] * 600],
                         ids=["one", "head-only", "tail-only", "one-vector", "vector-and-tail",
                              "a-block-of-vectors-or-eight-of-elements", "grid-turns-600-counters"])
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_every_element_and_counter_advances_exactly_once(emulated, numels, placement):
    total = sum(numels)
    flat = [torch.zeros(total, dtype=torch.bfloat16), torch.ones(total, dtype=torch.bfloat16),
            torch.zeros(total, dtype=torch.bfloat16), torch.zeros(total, dtype=torch.bfloat16),
            torch.full((len(numels),), 5.0), None]
    guarded = GuardedFlat(flat, _shifts(placement))
    emulated.take_launches()
    emulated.fused_adam_flat_(*guarded.buffers, **COUNTING, adam_w_mode=True)
    guarded.assert_guards_intact()
    wrong = (guarded.buffers[0] != -1).nonzero().flatten()
    assert wrong.numel() == 0, f"elements {wrong[:5].tolist()} hold {guarded.buffers[0][wrong[:5]].tolist()}"
    assert torch.equal(guarded.buffers[4], torch.full((len(numels),), 6.0))
    adam, counters = emulated.take_launches()
    assert adam == (_blocks(_units(total, placement)), BLOCK)
    assert counters == (-(-len(numels) // BLOCK), BLOCK)


@pytest.mark.parametrize("found_inf", [1.0, 2.0, float("inf")])
def test_found_inf_writes_nothing_and_keeps_counters(emulated, found_inf):
    guarded = GuardedFlat(flat_of(tensor_lists(NUMELS, (torch.float32, torch.float16, torch.float32, torch.float16))),
                          _shifts("vector-loads"))
    before = [None if t is None else t.clone() for t in guarded.buffers]
    emulated.fused_adam_flat_(*guarded.buffers, **HYPER, adam_w_mode=True, grad_scale=torch.tensor([8.0]),
                              found_inf=torch.tensor([found_inf]), unscale_grads=True)
    _assert_bitwise_equal(guarded.buffers, before)
    guarded.assert_guards_intact()


def test_fp16_moments_are_a_launch_error(emulated):
    flat = flat_of(tensor_lists([4], (torch.float32, torch.float32, torch.float32, None)))
    flat[2], flat[3] = flat[2].half(), flat[3].half()
    with pytest.raises(RuntimeError, match="cudaError 1"):
        emulated.fused_adam_flat_(*flat, **HYPER, adam_w_mode=True)
