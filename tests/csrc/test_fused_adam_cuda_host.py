"""The CUDA FusedAdam kernel's own source, run on the CPU through csrc/cuda/host_emulation.h (marker ``cuda_host``).

``csrc/cuda/fused_adam.cu`` and ``multi_tensor_apply.cuh``, launch code included, are compiled by g++
(tests/csrc/emulated_cuda.py) and every launch runs each block and thread serially. Checked here:

* bit-identical results to the compiled CPU kernel for every dtype combination the op accepts, both
  Adam modes, with and without ``grad_scale`` (and the unscaled grads it writes back), and with
  ``found_inf`` set (nothing written, step counters unchanged);
* the packing of tensors into launches (NOTE [flush rule] in multi_tensor_apply.cuh) with the real
  constants (65536-element chunks, 32 tensors and 435 blocks per launch, 480 step counters per
  launch): every element of every tensor is updated exactly once and every step counter advanced
  exactly once, while the launches recorded by the emulation show that each case crosses the rule
  it names. The "counting" hyper-parameters (beta1 = beta2 = eps = 0, lr = 1, no bias correction)
  turn each update of a zero weight with gradient 1 into a step of exactly -1, so a weight holding
  -1 was updated once, 0 never, -2 twice.

Every tensor the emulated kernel gets lies in one buffer between guard bands (:class:`Guarded`),
so a write past a chunk or tensor end is caught even where it would corrupt nothing else.

Mutation check, done by hand on 2026-11-23 in a scratch copy of the tree (one-character changes to
the kernel's index, tail and packing arithmetic; the whole module run against each):

==========================================================  =============================================
mutation                                                    result
==========================================================  =============================================
fused_adam.cu store loop ``if (i < end)`` -> ``i <= end``   184 failed (guard bands written past chunk
                                                            and tensor ends, where the last loop turn
                                                            is longer than one row of threads)
``i = base + k * blockDim.x`` -> ``blockDim.y``             188 failed (elements skipped / repeated)
``base += blockDim.x * kILP`` -> ``blockDim.x + kILP``      186 failed
``end = min(begin + kChunkSize, ...)`` -> ``begin -``       188 failed (nothing updated)
``+ 1.0`` -> ``+ 2.0`` in the kernel's step count          184 failed (bias corrections of the wrong step)
multi_tensor_apply.cuh ``(numels[t] + kChunkSize - 1)``     3 failed: the packing cases (a 1-element
-> ``- 2``                                                  tensor gets no chunk)
final flush ``blocks > 0`` -> ``blocks > 1``                3 failed: block-table-exact (its trailing
                                                            1-block launch is lost), one-tensor calls
carry-over ``numel[0] = numel[tensors - 1]`` -> ``- 2``     1 failed: tensor-cut (continued chunks use
                                                            the previous tensor's size)
carry-over ``tensors = 1`` -> ``tensors = 0``               the test process crashes (SIGSEGV)
step launches ``steps[first + i]`` -> ``steps[first + 1]``  the test process crashes (SIGSEGV)
``last_chunk = c == chunks - 1`` -> ``chunks - 2``          the test process crashes (SIGSEGV: the
                                                            tensor table overflows)
==========================================================  =============================================
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Tuple

import pytest
import torch

from apexlite._native import loader as _ext
from tests.csrc import emulated_cuda

pytestmark = [
    pytest.mark.cuda_host,
    pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel (the oracle) not built"),
]

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
# (param, grad, moment, copy or None): every combination the op accepts.
DTYPE_COMBOS = [
    (p, g, m, c)
    for p, g, m, c in itertools.product(FLOATS, FLOATS, [torch.float32, torch.bfloat16], [None] + FLOATS[1:])
    if c is None or p == torch.float32
]
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, bias_correction=True)
# one update of a zero weight with gradient 1 is exactly -1 (see the module docstring)
COUNTING = dict(lr=1.0, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=0.0, bias_correction=False)
CHUNK, MAX_BLOCKS, MAX_TENSORS, MAX_STEPS = 65536, 435, 32, 480  # multi_tensor_apply.cuh, fused_adam.cu
STRIDE = 512 * 4  # elements a block covers per loop turn (kBlockSize * kILP)
# a tail shorter than one turn, a tensor of one partial turn, and a second chunk whose last turn is
# partial but longer than one thread row (where a thread's later elements can land exactly on the end)
NUMELS = [5, 1000, CHUNK + 2 * STRIDE + 1000]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The CPU oracle on one thread: its many small parallel regions stall for whole time slices on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def emulated():
    return emulated_cuda.kernels_or_skip()


def _lists(numels, combo, seed=0):
    param, grad, moment, copy = combo
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n, scale=1.0: torch.randn(n, generator=gen) * scale  # noqa: E731
    params = [rand(n).to(param) for n in numels]
    grads = [rand(n, 100.0).to(grad) for n in numels]
    exp_avgs = [rand(n, 0.1).to(moment) for n in numels]
    exp_avg_sqs = [rand(n).abs().to(moment) for n in numels]
    steps = [torch.full((), 3.0) for _ in numels]
    copies = [p.to(copy) for p in params] if copy else []
    return [params, grads, exp_avgs, exp_avg_sqs, steps, copies]


def _clone(lists):
    return [[t.clone() for t in lst] for lst in lists]


GUARD, GUARD_VALUE = 2048, -123.0  # elements around each tensor, and what they hold (exact in every dtype)
STEPS_LIST = 4


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits, with every NaN mapped to one pattern (CPU and CUDA spell NaN differently)."""
    bits = t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).to(torch.int64)
    return torch.where(torch.isnan(t.float()), torch.full_like(bits, -1), bits)


def assert_bitwise_equal(actual, expected):
    names = ("params", "grads", "exp_avgs", "exp_avg_sqs", "state_steps", "model_copies")
    for name, got_list, want_list in zip(names, actual, expected):
        for i, (got, want) in enumerate(zip(got_list, want_list)):
            assert got.dtype == want.dtype
            differ = (_bits(got) != _bits(want)).nonzero()
            assert differ.numel() == 0, f"{name}[{i}] differs at {differ[:5].flatten().tolist()}"


class Guarded:
    """The tensor lists laid out in one buffer per list, every tensor between two guard bands.

    Whatever the kernel writes outside a tensor's own elements (an index or tail bug writing past a
    chunk or tensor end) lands in a guard band, which :meth:`assert_guards_intact` checks.
    """

    def __init__(self, lists: List[List[torch.Tensor]]) -> None:
        self.lists: List[List[torch.Tensor]] = []
        self._guards: List[torch.Tensor] = []
        for position, tensors in enumerate(lists):
            if position == STEPS_LIST or not tensors:  # 0-dim step counters and empty lists stay as given
                self.lists.append(tensors)
                continue
            buffer = torch.full((sum(t.numel() + GUARD for t in tensors) + GUARD,), GUARD_VALUE,
                                dtype=tensors[0].dtype)
            views, offset = [], GUARD
            self._guards.append(buffer[:GUARD])
            for t in tensors:
                views.append(buffer[offset:offset + t.numel()].view(t.shape).copy_(t))
                offset += t.numel()
                self._guards.append(buffer[offset:offset + GUARD])
                offset += GUARD
            self.lists.append(views)

    def assert_guards_intact(self) -> None:
        for index, guard in enumerate(self._guards):
            written = (guard != GUARD_VALUE).nonzero().flatten()
            assert written.numel() == 0, f"guard band {index} written at offsets {written[:5].tolist()}"


@pytest.mark.parametrize("scaling", ["unscaled", "scaled-and-unscale-grads", "scaled-keep-grads"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_emulated_cuda_kernel_matches_cpu_kernel_bit_for_bit(emulated, combo, adam_w_mode, scaling):
    guarded = Guarded(_lists(NUMELS, combo))
    lists, expected = guarded.lists, _lists(NUMELS, combo)
    scale = None if scaling == "unscaled" else torch.tensor([3.0 if scaling == "scaled-keep-grads" else 65536.0])
    kwargs = dict(HYPER, adam_w_mode=adam_w_mode, grad_scale=scale, unscale_grads=scaling != "scaled-keep-grads")
    torch.ops.apexlite.fused_adam_(*expected, **kwargs)
    emulated.fused_adam_(*lists, **kwargs)
    assert_bitwise_equal(lists, expected)
    guarded.assert_guards_intact()
    grads_written = not torch.equal(lists[1][2], _lists(NUMELS, combo)[1][2])
    assert grads_written == (scaling == "scaled-and-unscale-grads")


@pytest.mark.parametrize("found_inf", [1.0, 2.0, float("inf")])
@pytest.mark.parametrize("combo", [(torch.float32, torch.float16, torch.float32, torch.float16),
                                   (torch.bfloat16, torch.bfloat16, torch.bfloat16, None),
                                   (torch.float32, torch.float32, torch.float32, None)], ids=str)
def test_found_inf_writes_nothing_and_keeps_step_counters(emulated, combo, found_inf):
    guarded = Guarded(_lists([0, 3, 2 * CHUNK + 1, 0], combo))
    lists = guarded.lists
    before = _clone(lists)
    emulated.fused_adam_(*lists, **HYPER, adam_w_mode=True, grad_scale=torch.tensor([8.0]),
                         found_inf=torch.tensor([found_inf]), unscale_grads=True)
    assert_bitwise_equal(lists, before)
    guarded.assert_guards_intact()
    emulated.fused_adam_(*lists, **HYPER, adam_w_mode=True, found_inf=torch.tensor([0.0]))
    assert all(float(s) == 4.0 for s in lists[4])  # a clear flag does step


@dataclass(frozen=True)
class PackingCase:
    """Tensor sizes and the (blocks) of each Adam launch and (threads) of each step-counter launch."""

    numels: Tuple[int, ...]
    adam_launches: Tuple[int, ...]
    step_launches: int
    oracle: bool = True  # also compare bit for bit with the CPU kernel (small cases)


PACKING_CASES = {
    # 4 tensors with 5 chunks, then 1-chunk tensors: full tensor tables of 32 (the first holds 33
    # blocks), 500+ step counters (two counter launches); empty tensors first, between and last;
    # one element; chunk size - 1, chunk size, chunk size + 1
    "many-tensors": PackingCase((0, 1, CHUNK - 1, CHUNK, 0, CHUNK + 1) + (3,) * 500 + (0,),
                                (33,) + (32,) * 14 + (24,), 2),
    # exactly 32 tensors end exactly at a table flush: nothing is left for the final launch
    "exact-tensor-table": PackingCase((2,) * 32, (32,), 1),
    # the block table fills on the last chunk of a tensor; one more tensor goes to the final launch
    "block-table-exact": PackingCase((1, (MAX_BLOCKS - 1) * CHUNK - 5, 7), (MAX_BLOCKS, 1), 1, oracle=False),
    # a tensor cut when the block table fills: its remaining 6 chunks continue as slot 0
    "tensor-cut": PackingCase((430 * CHUNK, 10 * CHUNK + 3, 0, CHUNK - 1), (MAX_BLOCKS, 7), 1, oracle=False),
}


def _counting_lists(numels) -> List[List[torch.Tensor]]:
    """bf16 everywhere (8 bytes per element): weights 0 and gradients 1, whose update is exactly -1."""
    params = [torch.zeros(n, dtype=torch.bfloat16) for n in numels]
    grads = [torch.ones(n, dtype=torch.bfloat16) for n in numels]
    moments = [[torch.zeros(n, dtype=torch.bfloat16) for n in numels] for _ in range(2)]
    steps = [torch.full((), float(i)) for i in range(len(numels))]
    return [params, grads, moments[0], moments[1], steps, []]


def _blocks(numels) -> int:
    return sum((n + CHUNK - 1) // CHUNK for n in numels)


@pytest.mark.parametrize("name", list(PACKING_CASES))
def test_packing_updates_every_element_and_step_counter_exactly_once(emulated, name):
    case = PACKING_CASES[name]
    assert sum(case.adam_launches) == _blocks(case.numels)  # the expected table itself adds up
    guarded = Guarded(_counting_lists(case.numels))
    lists = guarded.lists
    emulated.take_launches()  # forget earlier tests' launches
    emulated.fused_adam_(*lists, **COUNTING, adam_w_mode=True)
    guarded.assert_guards_intact()
    launches = emulated.take_launches()
    assert [blocks for blocks, threads in launches if threads != MAX_STEPS] == list(case.adam_launches)
    assert launches[-case.step_launches:] == [(1, MAX_STEPS)] * case.step_launches
    for i, (param, step) in enumerate(zip(lists[0], lists[4])):
        wrong = (param != -1).nonzero().flatten()
        assert wrong.numel() == 0, f"tensor {i} ({param.numel()} elements): elements {wrong[:5].tolist()} hold " \
                                   f"{param[wrong[:5]].tolist()} (0: never updated, -2: twice)"
        assert float(step) == i + 1, f"step counter {i} advanced {float(step) - i} times"


@pytest.mark.parametrize("name", [n for n, c in PACKING_CASES.items() if c.oracle])
def test_packing_cases_match_cpu_kernel_on_random_data(emulated, name):
    combo = (torch.float32, torch.bfloat16, torch.float32, torch.float16)
    guarded = Guarded(_lists(PACKING_CASES[name].numels, combo))
    expected = _lists(PACKING_CASES[name].numels, combo)
    torch.ops.apexlite.fused_adam_(*expected, **HYPER, adam_w_mode=False)
    emulated.fused_adam_(*guarded.lists, **HYPER, adam_w_mode=False)
    assert_bitwise_equal(guarded.lists, expected)
    guarded.assert_guards_intact()


@pytest.mark.parametrize("copy_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_conversions_round_like_torch(emulated, copy_dtype):
    # lr=0 keeps the fp32 params exact, so the copies show the conversion alone: ties to even, the
    # largest finite values and the first that overflow, subnormals and the smallest that round to 0
    special = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.99, 65520.0, 3.4e38,
               -70000.0, float("inf"), float("-inf"), 2**-24, 2**-25, 2**-25 * 1.0001, 3 * 2**-26, 1e-40,
               -1e-41, 0.0, -0.0, 2**-14, 2**-14 - 2**-25]
    values = torch.cat([torch.tensor(special), torch.randn(4096) * torch.logspace(-30, 30, 4096)])
    lists = _lists([values.numel()], (torch.float32, torch.float32, torch.float32, copy_dtype))
    lists[0][0].copy_(values)
    lists[1][0].zero_()
    emulated.fused_adam_(*lists, **dict(HYPER, lr=0.0, weight_decay=0.0), adam_w_mode=True)
    assert torch.equal(_bits(lists[5][0]), _bits(values.to(copy_dtype)))
    # and back: the kernel's widening of those copies (as grads of another call) is exact
    widened = _lists([values.numel()], (torch.float32, copy_dtype, torch.float32, None))
    widened[1][0].copy_(lists[5][0])
    expected = _clone(widened)
    torch.ops.apexlite.fused_adam_(*expected, **HYPER, adam_w_mode=True)
    emulated.fused_adam_(*widened, **HYPER, adam_w_mode=True)
    assert_bitwise_equal(widened, expected)


def test_unsupported_dtype_mix_is_a_launch_error(emulated):
    # fp16 moments are refused by the launcher itself (the torch binding's checks normally stop them)
    lists = _lists([4], (torch.float32, torch.float32, torch.float16, None))
    with pytest.raises(RuntimeError, match="cudaError 1"):
        emulated.fused_adam_(*lists, **HYPER, adam_w_mode=True)
