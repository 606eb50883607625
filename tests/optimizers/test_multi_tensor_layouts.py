"""amp_C's kernels that take a loss scale (``inv_scale``), over every param and grad memory layout.

The capturable Adam kernels store the unscaled gradients into the grads they are given, in place; the
mixed-precision LAMB kernel leaves its update direction there (apex's rule). Either way the result
must be the one the same kernel gives on contiguous tensors holding the same values, a raised
``noop_flag`` must leave every tensor bit-identical, and a grad whose elements share memory (which
cannot receive values in place) is refused before anything changes. Each runs on apexlite's compiled
kernel and on torch's fused ops.
"""
from __future__ import annotations

from typing import List

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.compat import amp_C
from tests._helpers.layouts import CONTIGUOUS, SHAPES, Layout, layout_pairs, one_sided_pairs, same_bits
from tests._helpers.tolerances import dtype_tols

INV_SCALE = 2.0 ** -10
ADAM_KERNELS = ["multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master"]


@pytest.fixture(params=["kernel", "torch"])
def backend(request, monkeypatch):
    """The path apexlite's fused Adam step takes: its compiled kernel, or torch's fused ops."""
    if request.param == "kernel" and not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    if request.param == "torch":
        monkeypatch.setattr(_ext, "kernels_available", lambda device_type: False)
    return request.param


def _values(seed: int) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in SHAPES]


def _adam_lists(kernel: str, param_layout: Layout, grad_layout: Layout) -> List[List[torch.Tensor]]:
    """[grads (scaled), params, exp_avgs, exp_avg_sqs] (+ [fp32 masters], the params then being fp16)."""
    params = [param_layout(v) for v in _values(0)]
    grads = [grad_layout(v / INV_SCALE) for v in _values(1)]
    moments = [[torch.zeros_like(p) for p in params] for _ in range(2)]
    if kernel.endswith("master"):
        return [grads, [param_layout(p.half()) for p in params], *moments, params]
    return [grads, params, *moments]


def _call(kernel: str, lists: List[List[torch.Tensor]], noop: int) -> None:
    getattr(amp_C, kernel)(65536, torch.tensor([noop], dtype=torch.int), lists, torch.tensor(1e-2), 0.9, 0.999,
                           1e-8, torch.tensor([1], dtype=torch.int), 1, 1, 0.01, torch.tensor([INV_SCALE]))


def _snapshot(lists: List[List[torch.Tensor]]) -> List[List[torch.Tensor]]:
    return [[t.clone() for t in tensors] for tensors in lists]


def _assert_same_bits(lists, snapshot) -> None:
    for tensors, saved in zip(lists, snapshot):
        for now, then in zip(tensors, saved):
            assert same_bits(now, then)


PAIRS = [pytest.param(p, g, id=f"param={p.name}-grad={g.name}") for p, g in layout_pairs()]
ONE_SIDED = [pytest.param(p, g, id=f"param={p.name}-grad={g.name}") for p, g in one_sided_pairs()]


@pytest.mark.parametrize("param_layout, grad_layout", PAIRS)
@pytest.mark.parametrize("kernel", ADAM_KERNELS)
def test_capturable_adam_unscales_grads_in_place_whatever_the_layouts(kernel, param_layout, grad_layout, backend):
    lists = _adam_lists(kernel, param_layout, grad_layout)
    grads, before = list(lists[0]), _snapshot(lists)
    if grad_layout.overlapping:
        with pytest.raises(RuntimeError, match="share one memory location"):
            _call(kernel, lists, 0)
        _assert_same_bits(lists, before)
        return
    _call(kernel, lists, 0)
    contiguous = _adam_lists(kernel, CONTIGUOUS, CONTIGUOUS)
    _call(kernel, contiguous, 0)
    for got, want, kept in zip(lists[0], contiguous[0], grads):
        assert got is kept  # the very grad tensors, written in place
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # unscaled exactly (a power-of-two scale)
    for tensors, expected in zip(lists[1:], contiguous[1:]):
        for got, want in zip(tensors, expected):
            torch.testing.assert_close(got.float(), want.float(), **dtype_tols(got.dtype))


@pytest.mark.parametrize("param_layout, grad_layout", ONE_SIDED)
@pytest.mark.parametrize("kernel", ADAM_KERNELS)
def test_capturable_adam_with_the_flag_raised_changes_nothing(kernel, param_layout, grad_layout, backend):
    lists = _adam_lists(kernel, param_layout, grad_layout)
    before = _snapshot(lists)
    if grad_layout.overlapping:
        with pytest.raises(RuntimeError, match="share one memory location"):
            _call(kernel, lists, 1)
    else:
        _call(kernel, lists, 1)
    _assert_same_bits(lists, before)


def _lamb_mp_lists(param_layout: Layout, grad_layout: Layout) -> List[List[torch.Tensor]]:
    params = [param_layout(v) for v in _values(0)]
    grads = [grad_layout(v / INV_SCALE) for v in _values(1)]
    return [grads, params, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]]


def _call_lamb_mp(lists: List[List[torch.Tensor]]) -> None:
    norm = torch.stack([g.float().norm() for g in lists[0]]).norm()
    amp_C.multi_tensor_lamb_mp(65536, torch.tensor([0], dtype=torch.int), lists, torch.tensor(1e-2), 0.9, 0.999,
                               1e-6, torch.tensor([1], dtype=torch.int), 1, 0.01, 1, 1, norm, torch.tensor(1.0),
                               False, torch.zeros(1), torch.tensor([INV_SCALE]))


@pytest.mark.parametrize("param_layout, grad_layout", [p for p in ONE_SIDED if not p.values[1].overlapping])
def test_mixed_precision_lamb_kernel_does_not_depend_on_layouts(param_layout, grad_layout):
    lists = _lamb_mp_lists(param_layout, grad_layout)
    _call_lamb_mp(lists)
    contiguous = _lamb_mp_lists(CONTIGUOUS, CONTIGUOUS)
    _call_lamb_mp(contiguous)
    for tensors, expected in zip(lists, contiguous):  # grads hold the update direction, as in apex
        for got, want in zip(tensors, expected):
            torch.testing.assert_close(got, want, **dtype_tols(torch.float32))
