"""The no-compile path on torch's fused ops (NOTE [torch fused path]) against the pure-torch reference.

torch's kernel orders the float operations differently from apexlite's formula, so results agree
to float32 rounding (``dtype_tols``), not bit for bit; what must be exact is exact here: slicing
(an elementwise op gives the same bits however the elements are grouped), skipped steps (every
tensor keeps its bits, grads stay scaled), step counters, and which tensors are written.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from apexlite.optimizers import _torch_fused
from apexlite.optimizers._reference import reference_adam_step
from tests._helpers.tolerances import dtype_tols

pytestmark = pytest.mark.skipif(not _torch_fused.available("cpu"), reason="this torch has no fused Adam on CPU")

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_COMBOS = [  # (param, grad, moment, copy or None): every combination the op accepts
    (p, g, m, c)
    for p, g, m, c in itertools.product(FLOATS, FLOATS, [torch.float32, torch.bfloat16], [None] + FLOATS[1:])
    if c is None or p == torch.float32
]
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
NUMELS = [0, 1, 37, 1000, 5]
SLICED_NUMELS = [0, 1, 2, 3, 37, 0, 1000, 5, 2]


def _lists(combo, numels=NUMELS, shape=None):
    param, grad, moment, copy = combo
    gen = torch.Generator().manual_seed(0)
    make = (lambda n: torch.randn(n, generator=gen)) if shape is None else (
        lambda n: torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last))
    params = [make(n).to(param) for n in numels]
    grads = [(make(n) * 64).to(grad) for n in numels]
    exp_avgs = [make(n).mul(0.1).to(moment) for n in numels]
    exp_avg_sqs = [make(n).abs().to(moment) for n in numels]
    steps = [torch.full((), 3.0) for _ in numels]
    copies = [p.to(copy) for p in params] if copy else []
    return [params, grads, exp_avgs, exp_avg_sqs, steps, copies]


def _coarsest(combo):
    return next((d for d in (torch.bfloat16, torch.float16) if d in combo), torch.float32)


def _assert_lists_close(actual, expected, dtype):
    for got_list, want_list in zip(actual, expected):
        for got, want in zip(got_list, want_list):
            assert got.dtype == want.dtype and got.stride() == want.stride()
            torch.testing.assert_close(got.float(), want.float(), **dtype_tols(dtype))


def _assert_lists_equal(actual, expected):
    for got_list, want_list in zip(actual, expected):
        for got, want in zip(got_list, want_list):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_torch_path_matches_reference(combo, adam_w_mode, bias_correction):
    ours, ref = _lists(combo), _lists(combo)
    scale = torch.tensor([64.0])
    kw = dict(HYPER, adam_w_mode=adam_w_mode, bias_correction=bias_correction, grad_scale=scale, unscale_grads=True)
    _torch_fused.torch_fused_adam_step(*ours, **kw)
    reference_adam_step(*ref, **kw)
    _assert_lists_close(ours, ref, _coarsest(combo))
    assert [float(s) for s in ours[4]] == [4.0] * len(NUMELS)


@pytest.mark.parametrize("combo", [(torch.float32, torch.bfloat16, torch.float32, torch.bfloat16),
                                   (torch.float16, torch.float16, torch.bfloat16, None),
                                   (torch.float32, torch.float32, torch.float32, None)], ids=str)
def test_slices_update_every_element_once(monkeypatch, combo):
    monkeypatch.setitem(_torch_fused.SLICE_ELEMENTS, "cpu", 7)  # big tensors cut, small ones sharing a slice
    param, grad, moment, copy = combo
    params = [torch.zeros(n, dtype=param) for n in SLICED_NUMELS]
    grads = [torch.full((n,), 4.0, dtype=grad) for n in SLICED_NUMELS]  # 1 once unscaled by 4
    moments = [[torch.zeros(n, dtype=moment) for n in SLICED_NUMELS] for _ in range(2)]
    steps = [torch.full((), float(i)) for i in range(len(SLICED_NUMELS))]
    copies = [torch.zeros(n, dtype=copy) for n in SLICED_NUMELS] if copy else []
    _torch_fused.torch_fused_adam_step(
        params, grads, *moments, steps, copies, lr=1.0, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=0.0,
        bias_correction=False, adam_w_mode=True, grad_scale=torch.tensor([4.0]), unscale_grads=False,
        workspace=_torch_fused.Workspace())
    for tensor in params + copies:
        assert torch.equal(tensor, torch.full_like(tensor, -1.0))
    assert all(torch.equal(g, torch.full_like(g, 4.0)) for g in grads)  # read, never written
    assert [float(s) for s in steps] == [i + 1.0 for i in range(len(SLICED_NUMELS))]


@pytest.mark.parametrize("limit", [1, 3, 7, 64, 10_000])
def test_slices_cover_each_element_once_and_cut_only_big_tensors(limit):
    slices = _torch_fused._slices(SLICED_NUMELS, limit)
    covered = [[0] * n for n in SLICED_NUMELS]
    for pieces in slices:
        assert 0 < sum(end - start for _, start, end in pieces) <= limit
        for index, start, end in pieces:
            assert (start, end) == (0, SLICED_NUMELS[index]) or SLICED_NUMELS[index] > limit
            for element in range(start, end):
                covered[index][element] += 1
    assert all(count == 1 for counts in covered for count in counts)


def test_slices_match_one_call_to_float_rounding(monkeypatch):
    combo = (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
    whole, sliced = _lists(combo), _lists(combo)
    kw = dict(HYPER, adam_w_mode=True, bias_correction=True, grad_scale=torch.tensor([64.0]), unscale_grads=True)
    _torch_fused.torch_fused_adam_step(*whole, **kw)
    monkeypatch.setitem(_torch_fused.SLICE_ELEMENTS, "cpu", 7)
    _torch_fused.torch_fused_adam_step(*sliced, **kw, workspace=_torch_fused.Workspace())
    _assert_lists_close(sliced, whole, torch.float32)


@pytest.mark.parametrize("found_inf", [1.0, 3.0, float("nan")])
@pytest.mark.parametrize("combo", [(torch.float32, torch.float16, torch.float32, torch.float16),
                                   (torch.bfloat16, torch.bfloat16, torch.bfloat16, None),
                                   (torch.float32, torch.float32, torch.float32, None)], ids=str)
def test_found_inf_keeps_every_bit_and_step_counter(combo, found_inf):
    lists, before = _lists(combo), _lists(combo)
    _torch_fused.torch_fused_adam_step(*lists, **HYPER, adam_w_mode=True, bias_correction=True,
                                       grad_scale=torch.tensor([64.0]), found_inf=torch.tensor([found_inf]),
                                       unscale_grads=True)
    _assert_lists_equal(lists, before)


def test_channels_last_params_keep_their_layout():
    combo = (torch.float32, torch.bfloat16, torch.bfloat16, torch.float16)
    ours, ref = _lists(combo, numels=[1, 1], shape=(2, 3, 4, 5)), _lists(combo, numels=[1, 1], shape=(2, 3, 4, 5))
    assert not ours[0][0].is_contiguous()
    kw = dict(HYPER, adam_w_mode=True, bias_correction=True)
    _torch_fused.torch_fused_adam_step(*ours, **kw)
    reference_adam_step(*ref, **kw)
    _assert_lists_close(ours, ref, torch.bfloat16)


def test_workspace_is_reused_between_steps():
    combo = (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
    lists, workspace = _lists(combo), _torch_fused.Workspace()
    kw = dict(HYPER, adam_w_mode=True, bias_correction=True)
    _torch_fused.torch_fused_adam_step(*lists, **kw, workspace=workspace)
    first = workspace.pieces(torch.device("cpu"), 1, [1])[0].data_ptr()
    _torch_fused.torch_fused_adam_step(*lists, **kw, workspace=workspace)
    assert workspace.pieces(torch.device("cpu"), 1, [1])[0].data_ptr() == first
