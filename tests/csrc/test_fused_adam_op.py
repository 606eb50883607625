"""The ``apexlite::fused_adam_`` op itself: argument checks and kernel-vs-reference agreement.

Runs against whatever compiled kernels are present (CPU always when built; CUDA on a GPU machine),
with ``apexlite.optimizers._reference.reference_adam_step`` as the oracle.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers._reference import reference_adam_step
from tests._helpers.tolerances import dtype_tols

pytestmark = pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")

HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, bias_correction=True)
FLOATS = [torch.float32, torch.float16, torch.bfloat16]

# (param dtype, grad dtype, moment dtype, copy dtype or None): every combination the op accepts.
DTYPE_COMBOS = [
    (p, g, m, c)
    for p, g, m, c in itertools.product(FLOATS, FLOATS, [torch.float32, torch.bfloat16], [None] + FLOATS[1:])
    if c is None or p == torch.float32
]

# Values that stress the element math: tiny and huge gradients, exact zeros, negative weights.
EDGE_GRADS = torch.tensor([0.0, -0.0, 1e-30, -1e-20, 1e-8, 3.0, -65000.0, 1e30])


def _lists(numels, param_dtype, grad_dtype, moment_dtype, copy_dtype, device="cpu", grads=None):
    params = [torch.randn(n, device=device).to(param_dtype) for n in numels]
    grads = grads or [torch.randn(n, device=device).to(grad_dtype) for n in numels]
    exp_avgs = [torch.rand(n, device=device).to(moment_dtype) for n in numels]
    exp_avg_sqs = [torch.rand(n, device=device).to(moment_dtype) for n in numels]
    steps = [torch.full((), 3.0, device=device) for _ in numels]
    copies = [p.to(copy_dtype) for p in params] if copy_dtype else []
    return params, grads, exp_avgs, exp_avg_sqs, steps, copies


def _clone(lists):
    return [[t.clone() for t in lst] for lst in lists]


def _compare(actual, expected, dtype):
    for got_list, want_list in zip(actual, expected):
        for got, want in zip(got_list, want_list):
            torch.testing.assert_close(got.float(), want.float(), **dtype_tols(dtype))


def _coarsest(*dtypes):
    for dtype in (torch.bfloat16, torch.float16):
        if dtype in dtypes:
            return dtype
    return torch.float32


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("param_dtype, grad_dtype, moment_dtype, copy_dtype", DTYPE_COMBOS)
def test_cpu_kernel_matches_reference(adam_w_mode, param_dtype, grad_dtype, moment_dtype, copy_dtype):
    lists = _lists([5, 1500], param_dtype, grad_dtype, moment_dtype, copy_dtype)
    expected = _clone(lists)
    torch.ops.apexlite.fused_adam_(*lists, adam_w_mode=adam_w_mode, **HYPER)
    reference_adam_step(*expected, adam_w_mode=adam_w_mode, **HYPER)
    _compare(lists, expected, _coarsest(param_dtype, moment_dtype, copy_dtype))


@pytest.mark.parametrize("grad_scale", [None, 1.0, 65536.0, 3.0])
def test_cpu_kernel_matches_reference_on_edge_values(grad_scale):
    scale = None if grad_scale is None else torch.tensor([grad_scale])
    grads = [EDGE_GRADS * (grad_scale or 1.0)]
    lists = _lists([len(EDGE_GRADS)], torch.float32, torch.float32, torch.float32, None, grads=grads)
    expected = _clone(lists)
    torch.ops.apexlite.fused_adam_(*lists, adam_w_mode=True, grad_scale=scale, **HYPER)
    reference_adam_step(*expected, adam_w_mode=True, grad_scale=scale, **HYPER)
    _compare(lists, expected, torch.float32)


def test_found_inf_leaves_every_tensor_untouched():
    lists = _lists([7, 0, 3000], torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
    before = _clone(lists)
    torch.ops.apexlite.fused_adam_(*lists, adam_w_mode=True, found_inf=torch.tensor([1.0]), **HYPER)
    for got_list, want_list in zip(lists, before):
        assert all(torch.equal(got, want) for got, want in zip(got_list, want_list))


def _bad(lists, which, index, tensor):
    lists[which][index] = tensor
    return lists


# name -> (how to break a valid argument set, message pattern)
BAD_ARGUMENTS = {
    "short_grad_list": (lambda l: l[:1] + [l[1][:1]] + l[2:], "list lengths differ"),
    "float64_params": (lambda l: [[t.double() for t in l[0]]] + l[1:], "float32, float16 or bfloat16"),
    "mixed_param_dtypes": (lambda l: _bad(l, 0, 1, l[0][1].half()), "each list must hold one dtype"),
    "fp16_moments": (lambda l: [l[0], l[1], [t.half() for t in l[2]], [t.half() for t in l[3]], l[4], l[5]],
                     "must both be float32 or both bfloat16"),
    "wrong_numel": (lambda l: _bad(l, 1, 0, torch.randn(4)), "has 4 elements"),
    "non_dense_param": (lambda l: _bad(l, 0, 0, torch.randn(10)[::2]), "dense block"),
    "mismatched_strides": (lambda l: _bad(l, 1, 1, torch.randn(6, 5).t()), "strides"),
    "int_step": (lambda l: _bad(l, 4, 0, torch.zeros((), dtype=torch.int64)), "state_steps"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_invalid_arguments_are_rejected_with_a_reason(case):
    params = [torch.randn(5), torch.randn(5, 6)]
    lists = [params, [torch.randn_like(p) for p in params], [torch.zeros_like(p) for p in params],
             [torch.zeros_like(p) for p in params], [torch.zeros(()) for _ in params], []]
    breaker, pattern = BAD_ARGUMENTS[case]
    with pytest.raises(RuntimeError, match=re.escape(pattern)):
        torch.ops.apexlite.fused_adam_(*breaker(lists), adam_w_mode=True, **HYPER)


def test_bad_found_inf_is_rejected():
    lists = _lists([3], torch.float32, torch.float32, torch.float32, None)
    with pytest.raises(RuntimeError, match="found_inf must be a 1-element float32"):
        torch.ops.apexlite.fused_adam_(*lists, adam_w_mode=True, found_inf=torch.zeros(2), **HYPER)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("param_dtype, grad_dtype, moment_dtype, copy_dtype", DTYPE_COMBOS)
def test_cuda_kernel_matches_cpu_kernel(adam_w_mode, param_dtype, grad_dtype, moment_dtype, copy_dtype):
    if not _ext.kernels_available("cuda"):
        pytest.skip("CUDA kernel not built (APEXLITE_CUDA=1 pip install --no-build-isolation -e .)")
    # 70 tensors cross the per-launch tensor table; 200_003 elements span several chunks.
    numels = [0, 1, 65535, 65536, 65537, 200_003] + [17] * 70 + [0]
    cpu_lists = _lists(numels, param_dtype, grad_dtype, moment_dtype, copy_dtype)
    cuda_lists = [[t.cuda() for t in lst] for lst in cpu_lists]
    torch.ops.apexlite.fused_adam_(*cpu_lists, adam_w_mode=adam_w_mode, **HYPER)
    torch.ops.apexlite.fused_adam_(*cuda_lists, adam_w_mode=adam_w_mode, **HYPER)
    _compare([[t.cpu() for t in lst] for lst in cuda_lists], cpu_lists,
             _coarsest(param_dtype, moment_dtype, copy_dtype))


@pytest.mark.parametrize("copy_dtype", [torch.float16, torch.bfloat16])
def test_half_copy_rounds_like_torch(copy_dtype):
    # Ties between two bf16/fp16 values, overflow, infinities, NaN and subnormals; lr=0 keeps the
    # fp32 params exact, so the copy must equal torch's own conversion exactly (any NaN payload).
    values = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 3.4e38, -70000.0,
                           float("inf"), float("-inf"), float("nan"), 1e-40, -1e-41, 0.0])
    lists = _lists([len(values)], torch.float32, torch.float32, torch.float32, copy_dtype)
    lists[0][0].copy_(values)
    lists[1][0].zero_()
    torch.ops.apexlite.fused_adam_(*lists, adam_w_mode=True, **dict(HYPER, lr=0.0, weight_decay=0.0))
    torch.testing.assert_close(lists[5][0], values.to(copy_dtype), rtol=0, atol=0, equal_nan=True)
