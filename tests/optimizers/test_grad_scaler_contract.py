"""Every optimizer under ``torch.amp.GradScaler``, over every param and grad memory layout.

torch's contract (torch/amp/grad_scaler.py, and its fused Adam kernels, which store the unscaled grad
in place only when given a grad_scale and return before any store when found_inf is 1): after a
clean ``scaler.step`` the grads are unscaled, in the tensors ``.grad`` holds; after a step skipped for
inf/NaN they are left as they were (scaled, for an optimizer that unscales inside its step; unscaled by
``unscale_`` otherwise) and params and state are bit-identical; after an explicit
``scaler.unscale_(opt)`` they are unscaled exactly once; a grad whose elements share memory cannot be
unscaled in place and is refused. Each case (tests/optimizers/scaler_cases.py) runs next to torch
optimizers on the same layouts (tests/_helpers/layouts.py): the grads must be what GradScaler's own
unscale leaves (torch.optim.SGD's run), bit for bit, and the params torch's update (or, where torch has
no such optimizer, its own on contiguous tensors). torch's fused AdamW is the reference for the grads
of FusedAdam on dense layouts only: on CPU it reads a grad with gaps between its elements as if it were
dense (torch 2.13), so on those layouts it computes from the gaps' contents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import pytest
import torch

from tests._helpers.layouts import (
    CONTIGUOUS, GRAD_LAYOUTS, SHAPES, STRIDED_SLICE, Layout, layout_pairs, one_sided_pairs, same_bits,
)
from tests._helpers.tolerances import dtype_tols
from tests.optimizers.scaler_cases import SCALER_CASES, ScalerCase, needs_torch_fused

SCALE = 2.0 ** 10  # a power of two, so scaling and unscaling are exact and grads compare bit for bit
SCENARIOS = ["plain", "clean", "overflow", "unscale-first", "unscale-first-overflow"]
INF_AT = (0, 0, 1, 2)  # inside the first slice along dim 0, so it survives the expanded layout


@dataclass
class Outcome:
    """What one run left: the .grad tensors, params and state after the step, or the error it raised."""

    params: List[torch.Tensor]
    grads: List[torch.Tensor]
    assigned: List[torch.Tensor]  # copies of the grads as they were before the step under test
    grads_in_place: bool  # every .grad is still the tensor assigned before the step, with its strides
    before: Any  # params and optimizer state right before the step under test
    after: Any
    error: Optional[RuntimeError]
    unscales_in_step: bool


def _values(seed: int, dtype: torch.dtype, exact_in: torch.dtype) -> List[torch.Tensor]:
    """Values for the two laid-out 4-D tensors and a bias, stored as ``dtype`` and exactly representable
    in ``exact_in`` (a reference in float32 gets the very values a half-precision run gets)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = SHAPES + [(4,)]
    return [torch.randn(shape, generator=gen).to(exact_in).to(dtype) for shape in shapes]


def _materialised(layout: Layout) -> Layout:
    """Contiguous tensors holding the values ``layout`` gives (for an expanded one, its first slice's)."""
    return Layout(f"contiguous({layout.name})", lambda values: layout(values).contiguous())


def _lay_out(values: List[torch.Tensor], layout: Layout) -> List[torch.Tensor]:
    return [layout(v) for v in values[:-1]] + [values[-1].clone()]


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {key: _clone(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(value) for value in obj)
    return obj


def _snapshot(params: List[torch.Tensor], optimizer: torch.optim.Optimizer) -> Any:
    return _clone([list(params), optimizer.state_dict()])


def _assert_same_bits(actual: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert same_bits(actual, expected)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            _assert_same_bits(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_same_bits(a, e)
    else:
        assert actual == expected


def run(make, dtype: torch.dtype, param_layout: Layout, grad_layout: Layout, scenario: str,
        exact_in: torch.dtype) -> Outcome:
    """One warm-up step on contiguous grads, then the step under test with grads in ``grad_layout``."""
    params = [torch.nn.Parameter(t) for t in _lay_out(_values(0, dtype, exact_in), param_layout)]
    optimizer = make(params)
    scaler = None if scenario == "plain" else torch.amp.GradScaler("cpu", init_scale=SCALE)
    before = error = None
    assigned: List[torch.Tensor] = []
    for step, layout in enumerate((CONTIGUOUS, grad_layout)):
        values = _values(step + 1, dtype, exact_in)
        under_test = step == 1
        if under_test and "overflow" in scenario:
            values[0][INF_AT] = float("inf")
        scale = 1.0 if scaler is None else scaler.scale(torch.ones(())).item()  # (also makes the scaler's scale)
        assigned = _lay_out([v * scale for v in values], layout)
        for param, grad in zip(params, assigned):
            param.grad = grad
        if under_test:
            before = _snapshot(params, optimizer)
            assigned_values = _clone(assigned)
        try:
            if scaler is None:
                optimizer.step()
            else:
                if scenario.startswith("unscale-first"):
                    scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
        except RuntimeError as raised:
            if not under_test:
                raise
            error = raised
    in_place = all(p.grad is g and p.grad.stride() == g.stride() for p, g in zip(params, assigned))
    return Outcome([p.detach() for p in params], [p.grad for p in params], assigned_values, in_place, before,
                   _snapshot(params, optimizer), error, bool(getattr(optimizer, "_step_supports_amp_scaling", False)))


def _torch_sgd(params: List[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1e-2)


def _torch_fused_adamw(params: List[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, fused=True)


def _assert_same_values(actual: List[torch.Tensor], expected: List[torch.Tensor]) -> None:
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, equal_nan=True)


def check_case(case: ScalerCase, param_layout: Layout, grad_layout: Layout, scenario: str) -> None:
    if case.param_dtype == torch.float16 and scenario.startswith("unscale-first"):
        pytest.skip("GradScaler.unscale_ refuses fp16 grads (torch's rule), for every optimizer")
    exact_in = case.param_dtype
    ours = run(case.make, case.param_dtype, param_layout, grad_layout, scenario, exact_in)
    grad_ref = run(_torch_sgd, torch.float32, param_layout, grad_layout, scenario, exact_in)  # GradScaler unscales
    if grad_ref.error is not None:  # torch cannot unscale such a grad in place: neither may we, and nothing changes
        assert ours.error is not None, f"torch raised {grad_ref.error!r}; {case.name} went on"
        _assert_same_bits(ours.after, ours.before)
        return
    assert ours.error is None, ours.error
    assert ours.grads_in_place, "the optimizer replaced .grad or changed its layout instead of writing into it"
    skipped_in_step = ours.unscales_in_step and scenario == "overflow"  # found_inf reached the step: grads kept
    _assert_same_values(ours.grads, ours.assigned if skipped_in_step else grad_ref.grads)
    if "overflow" in scenario:
        _assert_same_bits(ours.after, ours.before)
        return
    if case.torch_ref is not None:
        update_ref = run(case.torch_ref, torch.float32, param_layout, grad_layout, scenario, exact_in)
    else:
        update_ref = run(case.make, case.param_dtype, CONTIGUOUS, _materialised(grad_layout), scenario, exact_in)
    for got, want in zip(ours.params, update_ref.params):
        torch.testing.assert_close(got.float(), want.float(), **dtype_tols(case.param_dtype))


def _pairs(pairs):
    return [pytest.param(p, g, id=f"param={p.name}-grad={g.name}") for p, g in pairs]


@pytest.mark.parametrize("param_layout, grad_layout", _pairs(layout_pairs()))
@pytest.mark.parametrize("case", SCALER_CASES)
def test_clean_step_over_layout_pairs(case, param_layout, grad_layout):
    check_case(case, param_layout, grad_layout, "clean")


@pytest.mark.parametrize("scenario", ["plain", "overflow"])
@pytest.mark.parametrize("param_layout, grad_layout", _pairs(one_sided_pairs()))
@pytest.mark.parametrize("case", SCALER_CASES)
def test_plain_and_overflowing_steps_over_layouts(case, param_layout, grad_layout, scenario):
    check_case(case, param_layout, grad_layout, scenario)


@pytest.mark.parametrize("scenario", ["unscale-first", "unscale-first-overflow"])
@pytest.mark.parametrize("grad_layout", GRAD_LAYOUTS, ids=lambda layout: f"grad={layout.name}")
@pytest.mark.parametrize("case", SCALER_CASES)
def test_explicit_unscale_first_over_grad_layouts(case, grad_layout, scenario):
    check_case(case, CONTIGUOUS, grad_layout, scenario)


@needs_torch_fused
@pytest.mark.parametrize("scenario", ["clean", "overflow", "unscale-first"])
@pytest.mark.parametrize("param_layout, grad_layout",
                         _pairs((p, g) for p, g in one_sided_pairs() if STRIDED_SLICE not in (p, g)))
@pytest.mark.parametrize("case", [c for c in SCALER_CASES if c.values[0].name.startswith("FusedAdam")])
def test_fused_adam_leaves_grads_as_torch_fused_adamw_does(case, param_layout, grad_layout, scenario):
    if case.param_dtype == torch.float16 and scenario.startswith("unscale-first"):
        pytest.skip("GradScaler.unscale_ refuses fp16 grads (torch's rule), for every optimizer")
    ours = run(case.make, case.param_dtype, param_layout, grad_layout, scenario, case.param_dtype)
    ref = run(_torch_fused_adamw, torch.float32, param_layout, grad_layout, scenario, case.param_dtype)
    assert (ours.error is None) == (ref.error is None), (ours.error, ref.error)
    if ref.error is None:
        _assert_same_values(ours.grads, ref.grads)
