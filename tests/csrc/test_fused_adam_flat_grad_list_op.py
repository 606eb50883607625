"""The ``apexlite::fused_adam_flat_grad_list_`` op on the CPU: flat buffers with each grad read where it is.

Its update must equal, bit for bit, the flat op's over the same buffers with the grads concatenated into
one grad buffer (which the flat op tests pin to the list op), for every dtype combination, both Adam
modes, with and without a loss scale (the unscaled grads written into each grad tensor), with a gap
between ranges (left as it is), with ``found_inf`` set (nothing written, counters kept), and its checks
refuse what it cannot read. Also apexlite._C's direct calls of this op and of the flat op (what FusedAdam
calls each step, csrc/torch/op_calls.cpp) against torch.ops.
"""
from __future__ import annotations

import re

import pytest
import torch

from apexlite._native import loader as _ext
from tests.csrc.test_fused_adam_flat_op import DTYPE_COMBOS, HYPER, NUMELS, _bits, flat_of, tensor_lists

pytestmark = pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")

ROLES = ("param", "grad", "exp_avg", "exp_avg_sq", "steps", "model_copy")


def _offsets(numels, gap=0):
    starts, at = [], 0
    for n in numels:
        starts.append(at)
        at += n + gap
    return torch.tensor(starts, dtype=torch.int64)


def _assert_bitwise(actual, expected, name):
    differ = (_bits(actual) != _bits(expected)).nonzero().flatten()
    assert differ.numel() == 0, f"{name} differs from the flat op at {differ[:5].tolist()}"


def _grad_list_args(lists):
    """(flat buffers without the grad buffer, the grads as separate tensors, their offsets)."""
    flat = flat_of(lists)
    grads = [g.clone() for g in lists[1]]
    return flat, grads, _offsets([g.numel() for g in grads])


def _call(flat, grads, offsets, **kwargs):
    param, _, exp_avg, exp_avg_sq, steps, copy = flat
    torch.ops.apexlite.fused_adam_flat_grad_list_(param, grads, offsets, exp_avg, exp_avg_sq, steps, copy, **kwargs)


@pytest.mark.parametrize("scaling", ["unscaled", "scaled-and-unscale-grads", "scaled-keep-grads"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_grad_list_op_matches_flat_op_bit_for_bit(combo, adam_w_mode, scaling):
    lists = tensor_lists(NUMELS, combo)
    expected = flat_of(lists)
    flat, grads, offsets = _grad_list_args(lists)
    scale = None if scaling == "unscaled" else torch.tensor([3.0 if scaling == "scaled-keep-grads" else 65536.0])
    kwargs = dict(HYPER, bias_correction=True, adam_w_mode=adam_w_mode, grad_scale=scale,
                  unscale_grads=scaling != "scaled-keep-grads")
    torch.ops.apexlite.fused_adam_flat_(*expected, **kwargs)
    _call(flat, grads, offsets, **kwargs)
    for name, got, want in zip(ROLES, flat, expected):
        if name != "grad" and want is not None:
            _assert_bitwise(got, want, name)
    _assert_bitwise(torch.cat(grads), expected[1], "the grads")  # unscaled in place exactly when the flat op does


def test_elements_between_ranges_are_left_as_they_are():
    lists = tensor_lists(NUMELS, (torch.float32, torch.float32, torch.float32, None))
    expected = flat_of(lists)
    torch.ops.apexlite.fused_adam_flat_(*expected, **HYPER, bias_correction=True, adam_w_mode=True)
    gap = 3
    grads = [g.clone() for g in lists[1]]
    offsets = _offsets(NUMELS, gap)
    total = int(offsets[-1]) + NUMELS[-1]
    spread = [torch.full((total,), 7.0) for _ in range(3)]  # param, exp_avg, exp_avg_sq with sentinels between
    for buffer, role in zip(spread, (lists[0], lists[2], lists[3])):
        for start, tensor in zip(offsets.tolist(), role):
            buffer[start:start + tensor.numel()] = tensor
    steps = torch.full((len(NUMELS),), 3.0)
    torch.ops.apexlite.fused_adam_flat_grad_list_(spread[0], grads, offsets, spread[1], spread[2], steps, None,
                                                  **HYPER, bias_correction=True, adam_w_mode=True)
    covered = torch.zeros(total, dtype=torch.bool)
    for start, n in zip(offsets.tolist(), NUMELS):
        covered[start:start + n] = True
    for buffer, want in zip(spread, (expected[0], expected[2], expected[3])):
        _assert_bitwise(buffer[covered], want, "a covered range")
        assert torch.all(buffer[~covered] == 7.0)
    assert torch.equal(steps, torch.full((len(NUMELS),), 4.0))


@pytest.mark.parametrize("found_inf", [1.0, float("inf")])
def test_found_inf_writes_nothing_and_keeps_counters(found_inf):
    lists = tensor_lists(NUMELS, (torch.bfloat16, torch.bfloat16, torch.float32, None))
    flat, grads, offsets = _grad_list_args(lists)
    before = [None if t is None else t.clone() for t in flat], [g.clone() for g in grads]
    _call(flat, grads, offsets, **HYPER, bias_correction=True, adam_w_mode=True,
          grad_scale=torch.tensor([8.0]), found_inf=torch.tensor([found_inf]), unscale_grads=True)
    for got, want in zip(flat, before[0]):
        assert want is None or torch.equal(got, want)
    assert all(torch.equal(g, w) for g, w in zip(grads, before[1]))


def _invalid_cases():
    def base():
        lists = tensor_lists([4, 6], (torch.float32, torch.float32, torch.float32, None))
        return _grad_list_args(lists)

    def overlapping():
        flat, grads, _ = base()
        return flat, grads, torch.tensor([0, 3])

    def outside():
        flat, grads, _ = base()
        return flat, grads, torch.tensor([0, 5])

    def one_offset_short():
        flat, grads, _ = base()
        return flat, grads, torch.tensor([0])

    def mixed_dtypes():
        flat, grads, offsets = base()
        return flat, [grads[0], grads[1].half()], offsets

    def strided_grad():
        flat, grads, offsets = base()
        return flat, [grads[0], torch.randn(12)[::2]], offsets

    def int32_offsets():
        flat, grads, offsets = base()
        return flat, grads, offsets.int()

    return {
        "overlapping": (overlapping, "overlaps the grad before it"),
        "outside": (outside, "leaves the buffers"),
        "one-offset-short": (one_offset_short, "one entry per grad"),
        "mixed-dtypes": (mixed_dtypes, "of grads[0]'s dtype"),
        "strided-grad": (strided_grad, "must be a dense"),
        "int32-offsets": (int32_offsets, "int64 CPU tensor"),
    }


INVALID = _invalid_cases()


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_arguments_are_rejected_with_a_reason(case):
    make, message = INVALID[case]
    flat, grads, offsets = make()
    before = flat[0].clone()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        _call(flat, grads, offsets, **HYPER, bias_correction=True, adam_w_mode=True)
    assert torch.equal(flat[0], before)


def test_the_native_entry_point_calls_the_op_with_a_tuple_of_grads():
    """apexlite._C.fused_adam_flat_grad_list (what FusedAdam calls: no per-grad Python) is the op, bit for bit."""
    from apexlite._native.loader import native_module

    lists = tensor_lists(NUMELS, (torch.bfloat16, torch.float32, torch.float32, None))
    expected = flat_of(lists)
    flat, grads, offsets = _grad_list_args(lists)
    scale = torch.tensor([512.0])
    torch.ops.apexlite.fused_adam_flat_(*expected, **HYPER, bias_correction=True, adam_w_mode=False,
                                        grad_scale=scale, unscale_grads=True)
    param, _, exp_avg, exp_avg_sq, steps, copy = flat
    native_module().fused_adam_flat_grad_list(param, tuple(grads), offsets, exp_avg, exp_avg_sq, steps, copy,
                                              HYPER["lr"], HYPER["beta1"], HYPER["beta2"], HYPER["eps"],
                                              HYPER["weight_decay"], True, False, scale, None, True)
    for name, got, want in zip(ROLES, flat, expected):
        if name != "grad" and want is not None:
            _assert_bitwise(got, want, name)
    _assert_bitwise(torch.cat(grads), expected[1], "the grads")
    with pytest.raises(TypeError, match="tuple"):
        native_module().fused_adam_flat_grad_list(param, list(grads), offsets, exp_avg, exp_avg_sq, steps, copy,
                                                  1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, None, None, False)
    with pytest.raises(RuntimeError, match="a tuple of tensors"):
        native_module().fused_adam_flat_grad_list(param, (grads[0], 3.0), offsets, exp_avg, exp_avg_sq, steps, copy,
                                                  1e-3, 0.9, 0.999, 1e-8, 0.0, True, True, None, None, False)


@pytest.mark.parametrize("outcome", ["stepped", "refused"])
def test_the_native_entry_point_leaves_every_grad_s_references_as_they_were(outcome):
    """It lends the tuple's tensors to the op without taking references (csrc/torch/op_calls.cpp): every grad
    keeps its reference counts, Python's and its tensor's, after a step and after a refused call, and lives
    on with its values once the tuple is gone."""
    import sys

    from apexlite._native.loader import native_module

    lists = tensor_lists(NUMELS, (torch.float32, torch.float32, torch.float32, None))
    flat, grads, offsets = _grad_list_args(lists)
    param, _, exp_avg, exp_avg_sq, steps, copy = flat
    handed = tuple(grads)
    counts = [(sys.getrefcount(g), g._use_count()) for g in grads]
    if outcome == "refused":
        offsets = offsets.flip(0)  # out of order
    call = lambda: native_module().fused_adam_flat_grad_list(  # noqa: E731
        param, handed, offsets, exp_avg, exp_avg_sq, steps, copy, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True,
        torch.tensor([4.0]), None, True)
    if outcome == "refused":
        with pytest.raises(RuntimeError, match="overlaps the grad before it"):
            call()
    else:
        call()
    assert [(sys.getrefcount(g), g._use_count()) for g in grads] == counts
    values = [g.clone() for g in grads]
    del handed
    assert all(torch.equal(g, v) for g, v in zip(grads, values))


@pytest.mark.parametrize("op", ["fused_adam_", "fused_adam_flat_", "fused_adam_flat_grad_list_", "flat_gather_"])
def test_the_optimizer_ops_fall_through_autograd(op):
    """Not differentiable: autograd hands them to the backend kernel directly (csrc/torch/ops.cpp), instead of
    its fallback boxing every argument and asking each tensor of a list whether it requires grad."""
    dump = torch._C._dispatch_dump(f"apexlite::{op}")
    autograd = [line for line in dump.splitlines() if line.startswith("Autograd[alias]")]
    assert len(autograd) == 1 and "fallthrough" in autograd[0], dump


def test_the_native_flat_entry_point_is_the_flat_op():
    """apexlite._C.fused_adam_flat (FusedAdam's call of the flat op, positional) against torch.ops, bit for bit."""
    from apexlite._native.loader import native_module

    combo = (torch.float32, torch.bfloat16, torch.bfloat16, torch.float16)
    expected, got = flat_of(tensor_lists(NUMELS, combo)), flat_of(tensor_lists(NUMELS, combo))
    scale, found = torch.tensor([64.0]), torch.zeros(1)
    torch.ops.apexlite.fused_adam_flat_(*expected, **HYPER, bias_correction=False, adam_w_mode=True,
                                        grad_scale=scale, found_inf=found, unscale_grads=True)
    native_module().fused_adam_flat(*got, HYPER["lr"], HYPER["beta1"], HYPER["beta2"], HYPER["eps"],
                                    HYPER["weight_decay"], False, True, scale, found, True)
    for name, a, b in zip(ROLES, got, expected):
        if b is not None:
            _assert_bitwise(a, b, name)
    with pytest.raises(RuntimeError, match="contiguous 1-D tensor"):
        native_module().fused_adam_flat(got[0], got[1][:-1], *got[2:], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True,
                                        None, None, False)
