"""Every optimizer that runs under ``torch.amp.GradScaler``, as data, with its torch reference.

Two kinds (torch's contract, torch/amp/grad_scaler.py): an optimizer with ``_step_supports_amp_scaling``
receives ``grad_scale``/``found_inf`` and unscales inside its step, storing the unscaled grads into
``.grad`` in place (FusedAdam on each of its paths, FusedMixedPrecisionLamb); for every other one
GradScaler unscales ``.grad`` itself before the step. Either way the grads after ``scaler.step`` must be
what torch leaves, and the update must not depend on how params and grads are laid out in memory.

``torch_ref`` is the torch.optim optimizer with the same update (run on float32 copies); where torch
has none, the reference is the same optimizer on contiguous params and grads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import pytest
import torch

from apexlite.compat.apex.contrib.optimizers import FusedAdam as ContribFusedAdam
from apexlite.optimizers import (
    FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD, _torch_fused,
)
from tests.optimizers.adam_helpers import IMPLEMENTATIONS

Make = Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer]
LR = 1e-2


@dataclass(frozen=True)
class ScalerCase:
    name: str
    make: Make
    torch_ref: Optional[Make] = None
    param_dtype: torch.dtype = torch.float32


def _adamw(params: List[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01, foreach=False)


def _fused_adam_cases() -> list:
    cases = []
    for impl in IMPLEMENTATIONS:
        name = impl if isinstance(impl, str) else impl.values[0]
        marks = () if isinstance(impl, str) else impl.marks
        make_fp32 = lambda ps, name=name: FusedAdam(ps, lr=LR, weight_decay=0.01, implementation=name)  # noqa: E731
        make_masters = lambda ps, name=name: FusedAdam(ps, lr=LR, weight_decay=0.01,  # noqa: E731
                                                       master_weights=True, implementation=name)
        cases.append(pytest.param(ScalerCase(f"FusedAdam[{name}]", make_fp32, _adamw),
                                  marks=marks, id=f"FusedAdam[{name}]"))
        if name != "reference":  # (the reference path is the fp32 case's and the odd layouts' own)
            cases.append(pytest.param(ScalerCase(f"FusedAdam[{name},fp16+masters]", make_masters, _adamw,
                                                 torch.float16), marks=marks, id=f"FusedAdam[{name},fp16+masters]"))
    return cases


def _case(name: str, make: Make, torch_ref: Optional[Make] = None, param_dtype: torch.dtype = torch.float32):
    return pytest.param(ScalerCase(name, make, torch_ref, param_dtype), id=name)


# Every optimizer that runs under GradScaler. apex.contrib's FusedLAMB is FusedLAMB with another
# constructor (same step); apex.contrib's FusedSGD takes its grads from FP16_Optimizer only.
SCALER_CASES = _fused_adam_cases() + [
    _case("FusedSGD", lambda ps: FusedSGD(ps, lr=LR, momentum=0.9, weight_decay=0.01),
          lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9, weight_decay=0.01, foreach=False)),
    _case("FusedAdagrad", lambda ps: FusedAdagrad(ps, lr=LR, weight_decay=0.01),
          lambda ps: torch.optim.Adagrad(ps, lr=LR, weight_decay=0.01, foreach=False)),
    _case("FusedLAMB", lambda ps: FusedLAMB(ps, lr=LR)),
    _case("FusedNovoGrad", lambda ps: FusedNovoGrad(ps, lr=LR, weight_decay=0.01)),
    _case("FusedMixedPrecisionLamb", lambda ps: FusedMixedPrecisionLamb(ps, lr=LR)),
    _case("FusedMixedPrecisionLamb[bf16+masters]",
          lambda ps: FusedMixedPrecisionLamb(ps, lr=LR, reduced_precision_dtype=torch.bfloat16),
          param_dtype=torch.bfloat16),
    _case("contrib.FusedAdam", lambda ps: ContribFusedAdam(ps, lr=LR, weight_decay=0.01)),
]

needs_torch_fused = pytest.mark.skipif(not _torch_fused.available("cpu"), reason="torch has no fused AdamW on CPU")
