"""Shared pieces of the FusedAdam tests: backends, fp32 torch references, comparisons.

Every numeric test runs FusedAdam next to ``torch.optim.Adam`` / ``AdamW`` (single-tensor form) on
fp32 copies of the same params, feeds both the same gradients, and compares params *and* state.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import _torch_fused
from tests._helpers.tolerances import dtype_tols

STEPS = 7  # enough steps for the bias corrections to stop dominating the update

# The compiled CPU kernel, torch's fused ops and the pure-torch reference must pass the same tests.
IMPLEMENTATIONS = [
    pytest.param(
        "kernel",
        marks=pytest.mark.skipif(
            not _ext.kernels_available("cpu"),
            reason="compiled CPU kernel not built (pip install --no-build-isolation -e .)",
        ),
    ),
    pytest.param(
        "torch",
        marks=pytest.mark.skipif(not _torch_fused.available("cpu"), reason="this torch has no fused Adam on CPU"),
    ),
    "reference",
]

HALF_DTYPES = [torch.float16, torch.bfloat16]


def torch_adam(params: Sequence[torch.Tensor], adam_w_mode: bool, **hyper) -> torch.optim.Optimizer:
    """The torch optimizer FusedAdam must agree with (AdamW for adam_w_mode, else Adam)."""
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    hyper.setdefault("weight_decay", 0.0)
    return cls(params, foreach=False, **hyper)


def fp32_leaves(tensors: Sequence[torch.Tensor]) -> List[torch.nn.Parameter]:
    return [torch.nn.Parameter(t.detach().float().clone()) for t in tensors]


def leaves(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> List[torch.nn.Parameter]:
    return [torch.nn.Parameter(t.detach().to(dtype).clone()) for t in tensors]


def set_grads(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        if g.dtype != p.dtype:
            if not hasattr(torch.Tensor, "grad_dtype"):
                pytest.skip("this torch cannot attach a gradient of another dtype (no Tensor.grad_dtype)")
            p.grad_dtype = g.dtype
        p.grad = g.clone()


def random_grads(params: Sequence[torch.Tensor], dtype: torch.dtype) -> List[torch.Tensor]:
    return [torch.randn(p.shape).to(dtype) for p in params]


def run_side_by_side(ours, ours_params, ref, ref_params, grad_dtype: torch.dtype, steps: int = STEPS) -> None:
    """Steps both optimizers with the same gradients (``grad_dtype`` for ours, their fp32 value for torch)."""
    for _ in range(steps):
        grads = random_grads(ours_params, grad_dtype)
        set_grads(ours_params, grads)
        set_grads(ref_params, [g.float() for g in grads])
        ours.step()
        ref.step()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    torch.testing.assert_close(actual.detach().float(), expected.detach().float(), **dtype_tols(dtype))


def assert_state_matches(ours, ours_params, ref, ref_params, dtype: torch.dtype = torch.float32) -> None:
    """Params (or their masters), both moments and the step count agree with the reference."""
    for p, r in zip(ours_params, ref_params):
        state: Dict[str, torch.Tensor] = ours.state[p]
        assert_close(state.get("master_param", p), r, dtype)
        assert_close(state["exp_avg"], ref.state[r]["exp_avg"], dtype)
        assert_close(state["exp_avg_sq"], ref.state[r]["exp_avg_sq"], dtype)
        assert float(state["step"]) == float(ref.state[r]["step"])
