"""What ``.grad`` holds after ``torch.amp.GradScaler.step(optimizer)``, for every apexlite optimizer.

torch's contract (torch/amp/grad_scaler.py, and its fused Adam kernels, which store the unscaled
grad only when given a grad_scale and return before any store when found_inf is 1): after a clean
``scaler.step`` the grads are unscaled; after a step skipped for inf/NaN they are left as they were
(scaled, for an optimizer that unscales inside its step; unscaled by ``unscale_`` otherwise); after
an explicit ``scaler.unscale_(opt)`` they are unscaled exactly once. Each apexlite optimizer runs
next to the torch optimizer that shares its way of handling the scale (torch's fused AdamW for
FusedAdam, which unscales in its step; a plain torch optimizer for the others, which GradScaler
unscales itself), through the same scaler calls, and the grads must agree bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from apexlite.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedNovoGrad, FusedSGD
from apexlite.optimizers import _torch_fused
from tests.optimizers.adam_helpers import IMPLEMENTATIONS

# name -> (apexlite optimizer, torch optimizer with the same scale handling)
OPTIMIZERS = {
    "FusedSGD": (lambda p: FusedSGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "FusedLAMB": (lambda p: FusedLAMB(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    "FusedNovoGrad": (lambda p: FusedNovoGrad(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    "FusedAdagrad": (lambda p: FusedAdagrad(p, lr=1e-2), lambda p: torch.optim.Adagrad(p, lr=1e-2)),
}
SCENARIOS = ["clean", "overflow", "unscale-first", "unscale-first-overflow"]
needs_torch_fused = pytest.mark.skipif(not _torch_fused.available("cpu"), reason="torch has no fused Adam on CPU")


def _grads_after_scaler_step(make_optimizer, scenario: str):
    """Runs one scaled backward and ``scaler.step``; returns (grads, params, scale) afterwards."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = make_optimizer(params)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    x = torch.randn(5, 4)
    if "overflow" in scenario:
        x[0, 0] = float("inf")
    loss = (x @ params[0] + params[1]).pow(2).mean()
    scaler.scale(loss).backward()
    if scenario.startswith("unscale-first"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scale = scaler.get_scale()
    scaler.update()
    return [p.grad.clone() for p in params], [p.detach().clone() for p in params], scale


def _assert_same(actual, expected):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)


@needs_torch_fused
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fused_adam_leaves_grads_as_torch_fused_adamw_does(implementation, scenario):
    ours, ours_params, _ = _grads_after_scaler_step(lambda p: FusedAdam(p, lr=1e-2, implementation=implementation),
                                                    scenario)
    ref, ref_params, scale = _grads_after_scaler_step(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0, fused=True), scenario)
    _assert_same(ours, ref)
    if scenario == "overflow":  # skipped inside the step: still scaled (finite entries are large)
        assert ours[1].abs().max() > 1e3
    torch.testing.assert_close(ours_params, ref_params, rtol=1e-6, atol=1e-6)
    assert scale == 2.0**12


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_other_fused_optimizers_leave_grads_as_torch_optimizers_do(name, scenario):
    make_ours, make_ref = OPTIMIZERS[name]
    ours, _, _ = _grads_after_scaler_step(make_ours, scenario)
    ref, _, _ = _grads_after_scaler_step(make_ref, scenario)
    _assert_same(ours, ref)
    clean_grads, _, _ = _grads_after_scaler_step(make_ref, "clean")
    if "overflow" not in scenario:  # unscaled exactly once: the grads of an unscaled backward
        assert ours[1].abs().max() < 1e3 and torch.allclose(ours[1], clean_grads[1])
