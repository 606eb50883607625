"""Shared by the flat-buffer test modules: twin optimizers (flat buffers and the per-tensor path) on the
same params and grads, exact comparison, and counting the kernel calls a step makes."""
from __future__ import annotations

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam, _flat_grads
from apexlite.optimizers import fused_adam as fused_adam_module
from tests.optimizers.adam_helpers import IMPLEMENTATIONS

IMPLS = [impl for impl in IMPLEMENTATIONS if impl != "reference"]  # flat buffers need a fused path
SHAPES = [(6, 5), (5,), (2, 3, 4, 5), (1,), (7, 3)]
HYPER = dict(lr=1e-2, weight_decay=0.02)
# (param dtype, master_weights, grad dtype, moment dtype)
COMBOS = [
    (torch.float32, False, torch.float32, torch.float32),
    (torch.bfloat16, True, torch.bfloat16, torch.float32),
    (torch.float16, True, torch.float16, torch.float32),
    (torch.bfloat16, False, torch.bfloat16, torch.bfloat16),
    (torch.float32, False, torch.bfloat16, torch.float32),
]


@pytest.fixture(params=["native", "python"])
def grad_pass(request, monkeypatch):
    """The grad passes (each step's, zero_grad's): apexlite._C.flat_grads and flat_zero_grads, or their Python twins."""
    if request.param == "native":
        if _flat_grads._native("flat_grads") is None:
            pytest.skip("apexlite's compiled library is not loaded")
    else:
        monkeypatch.setattr(_flat_grads, "_native", lambda name: None)
    return request.param


def make_params(dtype=torch.float32, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape in shapes]


def twins(dtype=torch.float32, implementation="kernel", shapes=SHAPES, **kw):
    """(params, optimizer) with flat buffers, and the same on the per-tensor path."""
    if implementation == "kernel" and not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    runs = []
    for flat in (True, False):
        params = make_params(dtype, shapes)
        runs.append((params, FusedAdam(params, implementation=implementation, flat_buffers=flat, **HYPER, **kw)))
    return runs


def grads_for(params, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=gen).to(dtype) for p in params]


def assert_same(run, reference, exact=True):
    (params, opt), (ref_params, ref_opt) = run, reference
    check = (lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0)) if exact else \
        (lambda a, b: torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-6))
    for p, r in zip(params, ref_params):
        check(p.detach(), r.detach())
        assert opt.state[p].keys() == ref_opt.state[r].keys()
        for key in opt.state[p]:
            check(opt.state[p][key], ref_opt.state[r][key])


def count_calls(monkeypatch):
    """Counts the calls FusedAdam.step makes: over flat buffers with the grad buffer ("flat"), over flat
    buffers reading each grad where it is ("read"), and per tensor ("lists")."""
    calls = {"flat": 0, "read": 0, "lists": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(fused_adam_module, "fused_adam_flat_step",
                        counting("flat", fused_adam_module.fused_adam_flat_step))
    monkeypatch.setattr(fused_adam_module, "fused_adam_flat_grad_list_step",
                        counting("read", fused_adam_module.fused_adam_flat_grad_list_step))
    monkeypatch.setattr(fused_adam_module, "fused_adam_step", counting("lists", fused_adam_module.fused_adam_step))
    return calls
