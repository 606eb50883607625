"""The ``apexlite::fused_adam_flat_`` op on the CPU: the list op's results bit for bit, and its checks.

The flat op is the list op over one tensor per role: its update of the concatenation of several
tensors must equal, bit for bit, the list op's update of those tensors one by one (same step count),
for every dtype combination, both Adam modes, with and without a loss scale (and the unscaled grads
written back), without bias correction, and with ``found_inf`` set (nothing written, counters kept).
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from apexlite._native import loader as _ext

pytestmark = pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_COMBOS = [
    (p, g, m, c)
    for p, g, m, c in itertools.product(FLOATS, FLOATS, [torch.float32, torch.bfloat16], [None] + FLOATS[1:])
    if c is None or p == torch.float32
]
HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
NUMELS = [5, 1, 40_000, 3]  # a task boundary (32768) inside a tensor, odd sizes around it
ROLES = ("params", "grads", "exp_avgs", "exp_avg_sqs", "state_steps", "model_copies")


def _bits(t: torch.Tensor) -> torch.Tensor:
    bits = t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).to(torch.int64)
    return torch.where(torch.isnan(t.float()), torch.full_like(bits, -1), bits)


def tensor_lists(numels, combo, step=3.0, seed=0):
    """Per-tensor lists (the list op's arguments) with random values in the combo's dtypes."""
    param, grad, moment, copy = combo
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen).to(param) for n in numels]
    grads = [(torch.randn(n, generator=gen) * 100).to(grad) for n in numels]
    exp_avgs = [(torch.randn(n, generator=gen) * 0.1).to(moment) for n in numels]
    exp_avg_sqs = [torch.rand(n, generator=gen).to(moment) for n in numels]
    steps = [torch.full((), step) for _ in numels]
    copies = [p.to(copy) for p in params] if copy else []
    return [params, grads, exp_avgs, exp_avg_sqs, steps, copies]


def flat_of(lists):
    """The flat op's arguments holding the same values: one concatenated buffer per role."""
    params, grads, exp_avgs, exp_avg_sqs, steps, copies = lists
    return [torch.cat(params), torch.cat(grads), torch.cat(exp_avgs), torch.cat(exp_avg_sqs),
            torch.stack(steps), torch.cat(copies) if copies else None]


def assert_flat_equals_lists(flat, lists):
    for name, buffer, tensors in zip(ROLES, flat, lists):
        if buffer is None:
            continue
        want = torch.stack(tensors) if name == "state_steps" else torch.cat(tensors)
        differ = (_bits(buffer) != _bits(want)).nonzero().flatten()
        assert differ.numel() == 0, f"{name} differs from the list op at {differ[:5].tolist()}"


@pytest.mark.parametrize("scaling", ["unscaled", "scaled-and-unscale-grads", "scaled-keep-grads"])
@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "l2"])
@pytest.mark.parametrize("combo", DTYPE_COMBOS, ids=lambda c: "-".join(str(d).split(".")[-1] for d in c))
def test_flat_op_matches_list_op_bit_for_bit(combo, adam_w_mode, scaling):
    lists = tensor_lists(NUMELS, combo)
    flat = flat_of(lists)
    scale = None if scaling == "unscaled" else torch.tensor([3.0 if scaling == "scaled-keep-grads" else 65536.0])
    kwargs = dict(HYPER, bias_correction=True, adam_w_mode=adam_w_mode, grad_scale=scale,
                  unscale_grads=scaling != "scaled-keep-grads")
    grads_before = flat[1].clone()
    torch.ops.apexlite.fused_adam_(*lists, **kwargs)
    torch.ops.apexlite.fused_adam_flat_(*flat, **kwargs)
    assert_flat_equals_lists(flat, lists)
    assert torch.equal(flat[4], torch.full((len(NUMELS),), 4.0))
    assert torch.equal(flat[1], grads_before) == (scaling != "scaled-and-unscale-grads")


def test_flat_op_without_bias_correction_matches_list_op():
    combo = (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
    lists = tensor_lists(NUMELS, combo, step=0.0)
    flat = flat_of(lists)
    kwargs = dict(HYPER, bias_correction=False, adam_w_mode=True)
    torch.ops.apexlite.fused_adam_(*lists, **kwargs)
    torch.ops.apexlite.fused_adam_flat_(*flat, **kwargs)
    assert_flat_equals_lists(flat, lists)


@pytest.mark.parametrize("found_inf", [1.0, float("nan")])
def test_found_inf_writes_nothing_and_keeps_counters(found_inf):
    flat = flat_of(tensor_lists(NUMELS, (torch.float32, torch.float16, torch.float32, torch.float16)))
    before = [t.clone() for t in flat]
    torch.ops.apexlite.fused_adam_flat_(*flat, **HYPER, bias_correction=True, adam_w_mode=True,
                                        grad_scale=torch.tensor([8.0]), found_inf=torch.tensor([found_inf]),
                                        unscale_grads=True)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(flat, before))


def test_empty_buffers_still_advance_counters():
    flat = [torch.empty(0), torch.empty(0), torch.empty(0), torch.empty(0), torch.zeros(2), None]
    torch.ops.apexlite.fused_adam_flat_(*flat, **HYPER, bias_correction=True, adam_w_mode=True)
    assert flat[4].tolist() == [1.0, 1.0]


def _valid():
    return flat_of(tensor_lists([4, 6], (torch.float32, torch.float32, torch.float32, None)))


def _replace(index, value):
    def breaker(flat):
        flat[index] = value(flat)
        return flat
    return breaker


# name -> (how to break a valid argument set, message pattern)
BAD_ARGUMENTS = {
    "short_grad": (_replace(1, lambda f: torch.randn(9)), "grad must be a contiguous 1-D tensor of 10 elements"),
    "2d_param": (_replace(0, lambda f: torch.randn(2, 5)), "param must be a contiguous 1-D buffer"),
    "strided_moment": (_replace(2, lambda f: torch.randn(20)[::2]), "exp_avg must be a contiguous 1-D tensor"),
    "float64_param": (_replace(0, lambda f: f[0].double()), "float32, float16 or bfloat16"),
    "fp16_moments": (lambda f: f[:2] + [f[2].half(), f[3].half()] + f[4:], "must both be float32 or both bfloat16"),
    "float32_copy": (_replace(5, lambda f: torch.randn(10)), "model_copy must be a float16 or bfloat16 copy"),
    "int_steps": (_replace(4, lambda f: torch.zeros(2, dtype=torch.int64)), "steps must be a contiguous 1-D float32"),
    "no_steps": (_replace(4, lambda f: torch.zeros(0)), "steps must be a contiguous 1-D float32"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_invalid_arguments_are_rejected_with_a_reason(case):
    breaker, pattern = BAD_ARGUMENTS[case]
    with pytest.raises(RuntimeError, match=re.escape(pattern)):
        torch.ops.apexlite.fused_adam_flat_(*breaker(_valid()), **HYPER, bias_correction=True, adam_w_mode=True)
