"""apex's L0 amp_C tests (tests/L0/run_amp/test_multi_tensor_*.py at e13873de), ported to CPU.

Only devices and tensor types change (`torch.cuda.FloatTensor(n)` -> `torch.empty(n)`, 'cuda' -> CPU).
The fuzz grids are apex's: its size pairs around the 2048*32 chunk boundary, 1 and 55 copies of each
pair, fp32/fp16 inputs and outputs, and apex's three chunk sizes (accepted and unused by apexlite,
which lets torch's foreach ops chunk). Results are checked against plain torch arithmetic, as apex did.
One apex check is adjusted, named where it happens: apex's unscale_l2norm test compares its (1,)-shaped
norm with a 0-d reference via `assert_close`, which fails on shape alone against apex's own kernel too.

apex's full grid (every pair with 55 copies, every chunk size) takes minutes on a CPU, so by default
the pairs up to 100k elements run with one copy (all but apex's largest, 900k-element pair), 55
copies run for the smallest pair, the channels_last pairs run up to 70k elements, and each pair meets
one of the chunk sizes (apexlite ignores chunk_size: torch's foreach ops chunk).
APEXLITE_APEX_L0_FULL=1 runs apex's whole grid, on CUDA when a GPU is present.
"""
import itertools
import os

import pytest
import torch

from apexlite.compat import amp_C
from apexlite.compat.apex.multi_tensor_apply import MultiTensorApply

SIZE_PAIRS = [(7777 * 77, 555 * 555), (777, 555), (555, 2048 * 32 + 1), (2048 * 32 + 1, 555),
              (555, 2048 * 32), (2048 * 32, 555), (33333, 555), (555, 33333)]
CHUNK_SIZES = [2048 * 32, 333, 33333]
REPEATS = [1, 55]
TYPES = [torch.float32, torch.float16]
FULL_GRID = os.environ.get("APEXLITE_APEX_L0_FULL") == "1"
DEVICE = "cuda" if FULL_GRID and torch.cuda.is_available() else "cpu"
MANY_COPIES_MAX_ELEMENTS = 2000  # default grid: 55 copies only of pairs up to this size
ONE_COPY_MAX_ELEMENTS = 100000  # default grid: pairs up to this size
NHWC_MAX_ELEMENTS = 70000  # default grid: channels_last pairs up to this size (CPU fp16 is slow on them)


def _overflow_buf():
    return torch.zeros(1, dtype=torch.int, device=DEVICE)


def _in_grid(index, elements, repeat, chunk_index, max_elements):
    if FULL_GRID:
        return True
    if chunk_index != index % len(CHUNK_SIZES) or elements > max_elements:
        return False
    return repeat == 1 or elements <= MANY_COPIES_MAX_ELEMENTS


def _grid(*extra):
    """(sizea, sizeb, chunk_size, repeat, *extra) rows of apex's grid (see the module docstring)."""
    rows = []
    for index, (sizea, sizeb) in enumerate(SIZE_PAIRS):
        for repeat, (chunk_index, chunk_size) in itertools.product(REPEATS, enumerate(CHUNK_SIZES)):
            if _in_grid(index, sizea + sizeb, repeat, chunk_index, ONE_COPY_MAX_ELEMENTS):
                rows += [(sizea, sizeb, chunk_size, repeat, *combo) for combo in itertools.product(*extra)]
    return rows


def _scale_case(sizea, sizeb, repeat, in_type, out_type, inplace, scale=4.0):
    a, b = torch.full((sizea,), scale, device=DEVICE), torch.full((sizeb,), scale, device=DEVICE)
    out_list = []
    for _ in range(repeat):
        out_list += [a.clone().to(out_type), b.clone().to(out_type)]
    in_list = out_list if inplace else [out.clone().to(in_type) for out in out_list]
    return in_list, out_list


SCALE_GRID = [row for row in _grid(TYPES, TYPES, [True, False]) if not (row[-1] and row[-3] is not row[-2])]


@pytest.mark.parametrize("sizea,sizeb,chunk_size,repeat,in_type,out_type,inplace", SCALE_GRID)
def test_multi_tensor_scale_fuzz(sizea, sizeb, chunk_size, repeat, in_type, out_type, inplace):
    applier = MultiTensorApply(chunk_size)
    overflow_buf = _overflow_buf()
    in_list, out_list = _scale_case(sizea, sizeb, repeat, in_type, out_type, inplace)
    applier(amp_C.multi_tensor_scale, overflow_buf, [in_list, out_list], 1.0 / 4.0)
    assert all(torch.allclose(out, torch.tensor([1.0], device=DEVICE).to(out_type)) for out in out_list)
    assert overflow_buf.item() == 0
    # find_inf: nan at the first element of the first tensor, inf at the end of the last one, inf mid-list
    for t, ind, val in [(0, 0, float("nan")), (2 * repeat - 1, sizeb - 1, float("inf")),
                        (2 * (repeat // 2), sizea // 2, float("inf"))]:
        in_list, out_list = _scale_case(sizea, sizeb, repeat, in_type, out_type, inplace)
        applier(amp_C.multi_tensor_scale, overflow_buf, [in_list, out_list], 1.0 / 4.0)
        overflow_buf.zero_()
        in_list[t][ind] = val
        applier(amp_C.multi_tensor_scale, overflow_buf, [in_list, out_list], 1.0 / 4.0)
        assert overflow_buf.item() == 1


NHWC_SIZE_PAIRS = [((7, 77, 7, 77), (5, 55, 5, 55)), ((1, 1, 777, 1), (1, 1, 555, 1)),
                   ((5, 47, 5, 55), (1, 1, 1, 2048 * 32 + 1)), ((1, 1, 1, 2048 * 32 + 1), (55, 47, 5, 55)),
                   ((555, 1, 1, 1), (32, 8, 32, 8)), ((32, 8, 32, 8), (55, 47, 5, 55)),
                   ((1, 1, 33333, 1), (55, 47, 55, 5)), ((55, 47, 55, 5), (1, 1, 33333, 1))]


def _axpby(sizea, sizeb, chunk_size, repeat, x_type, y_type, out_type, inplace, nhwc):
    a, b, xval, yval = 2.0, 8.0, 4.0, 16.0
    overflow_buf = _overflow_buf()
    sizea = sizea if isinstance(sizea, tuple) else (sizea,)
    sizeb = sizeb if isinstance(sizeb, tuple) else (sizeb,)
    t1, t2 = torch.full(sizea, 1.0, device=DEVICE), torch.full(sizeb, 1.0, device=DEVICE)

    def to_fmt(t, dtype):
        return t.clone().to(dtype, memory_format=torch.channels_last) if nhwc else t.clone().to(dtype)

    y_list = []
    for _ in range(repeat):
        y_list += [to_fmt(t1, y_type) * yval, to_fmt(t2, y_type) * yval]
    x_list = [to_fmt(x, x_type) * (xval / yval) for x in y_list]
    out_list = y_list if inplace else [to_fmt(out, out_type) * 3.0 for out in y_list]
    MultiTensorApply(chunk_size)(amp_C.multi_tensor_axpby, overflow_buf, [x_list, y_list, out_list], a, b, -1)
    reference = torch.full((1,), 136.0, device=DEVICE)
    assert all(torch.allclose(out, reference.to(out_type)) for out in out_list)
    assert all(out.dtype is out_type for out in out_list)
    assert overflow_buf.item() == 0


AXPBY_COMBOS = [combo for combo in itertools.product(TYPES, TYPES, TYPES, [True, False])
                if not (combo[3] and combo[1] is not combo[2])]


@pytest.mark.parametrize("sizea,sizeb,chunk_size,repeat", _grid())
def test_multi_tensor_axpby_fuzz(sizea, sizeb, chunk_size, repeat):
    for x_type, y_type, out_type, inplace in AXPBY_COMBOS:
        _axpby(sizea, sizeb, chunk_size, repeat, x_type, y_type, out_type, inplace, nhwc=False)


def _nhwc_grid():
    rows = []
    for index, (sizea, sizeb) in enumerate(NHWC_SIZE_PAIRS):
        elements = sum(torch.Size(size).numel() for size in (sizea, sizeb))
        for repeat, (chunk_index, chunk_size) in itertools.product(REPEATS, enumerate(CHUNK_SIZES)):
            if _in_grid(index, elements, repeat, chunk_index, NHWC_MAX_ELEMENTS):
                rows.append((sizea, sizeb, chunk_size, repeat))
    return rows


@pytest.mark.parametrize("sizea,sizeb,chunk_size,repeat", _nhwc_grid())
def test_multi_tensor_axpby_fuzz_nhwc(sizea, sizeb, chunk_size, repeat):
    for x_type, y_type, out_type, inplace in AXPBY_COMBOS:
        _axpby(sizea, sizeb, chunk_size, repeat, x_type, y_type, out_type, inplace, nhwc=True)


@pytest.mark.parametrize("sizea,sizeb,chunk_size,repeat,in_type,per_tensor", _grid(TYPES, [False, True]))
def test_multi_tensor_l2norm_fuzz(sizea, sizeb, chunk_size, repeat, in_type, per_tensor):
    val = 4.0
    overflow_buf = _overflow_buf()
    a, b = torch.full((sizea,), val, device=DEVICE), torch.full((sizeb,), val, device=DEVICE)
    in_list = []
    for _ in range(repeat):
        in_list += [a.clone().to(in_type), b.clone().to(in_type)]
    applier = MultiTensorApply(chunk_size)
    norm, norm_per_tensor = applier(amp_C.multi_tensor_l2norm, overflow_buf, [in_list], per_tensor)
    reference = torch.full(((sizea + sizeb) * repeat,), val, device=DEVICE).norm()
    assert norm.shape == (1,) and norm.dtype is torch.float32  # apex's shapes, see the module docstring
    torch.testing.assert_close(norm, reference.broadcast_to(norm.shape))
    if per_tensor:
        assert norm_per_tensor.shape == (2 * repeat,) and norm_per_tensor.dtype is torch.float32
        normab = torch.cat((a.norm().view(1), b.norm().view(1)))
        per_pair = norm_per_tensor.view(-1, 2)
        torch.testing.assert_close(per_pair, normab.broadcast_to(per_pair.shape))
    else:
        assert norm_per_tensor.shape == (0,) and norm_per_tensor.dtype is torch.float32
    assert overflow_buf.item() == 0


@pytest.mark.parametrize("sizea,sizeb,chunk_size,repeat,in_type,per_tensor", _grid(TYPES, [False, True]))
def test_multi_tensor_unscale_l2norm_fuzz(sizea, sizeb, chunk_size, repeat, in_type, per_tensor):
    val, inv_scale = 4.0, 0.5
    overflow_buf = _overflow_buf()
    a, b = torch.full([sizea], val, device=DEVICE), torch.full([sizeb], val, device=DEVICE)
    in_list = []
    for _ in range(repeat):
        in_list += [a.clone().to(in_type), b.clone().to(in_type)]
    before = [t.clone() for t in in_list]
    norm, norm_per_tensor = MultiTensorApply(chunk_size)(
        amp_C.multi_tensor_unscale_l2norm, overflow_buf, [in_list], torch.tensor([inv_scale], device=DEVICE), per_tensor)
    reference = torch.full([(sizea + sizeb) * repeat], val * inv_scale, device=DEVICE).norm()
    # apex compared `norm` (shape (1,)) with the 0-d `reference` directly: a shape mismatch on apex too.
    assert norm.shape == (1,)
    torch.testing.assert_close(norm, reference.view(1))
    if per_tensor:
        normab = torch.cat(((a * inv_scale).norm().view(1), (b * inv_scale).norm().view(1)))
        per_pair = norm_per_tensor.view(-1, 2)
        torch.testing.assert_close(per_pair, normab.broadcast_to(per_pair.shape))
    assert overflow_buf.item() == 0
    assert all(torch.equal(t, saved) for t, saved in zip(in_list, before))  # only the norm is unscaled
