"""`python -m apexlite doctor` names the FusedAdam path that is really active on each device, and why."""
from __future__ import annotations

import pytest
import torch

from apexlite import _ext, doctor
from apexlite.optimizers import _torch_fused

FALLBACK = "torch's fused Adam ops" if _torch_fused.available("cpu") else "pure-torch reference, slow"
# extension status -> how the doctor's CPU row must start
CPU_PATHS = {
    _ext.ExtensionStatus("installed", "/x/_C.so"): "apexlite's compiled kernel (apexlite._C)",
    _ext.ExtensionStatus("jit", "cache"): "apexlite's compiled kernel (JIT build, cached)",
    _ext.ExtensionStatus("unavailable", "no compiler"): f"{FALLBACK} (no apexlite kernel: no compiler",
    _ext.ExtensionStatus("disabled", "env"): f"{FALLBACK} (no apexlite kernel: env",
}


@pytest.mark.parametrize("found", list(CPU_PATHS), ids=lambda s: s.source)
def test_doctor_reports_cpu_path(monkeypatch, found):
    monkeypatch.setattr(_ext, "status", lambda: found)
    rows = dict(doctor.report())
    assert rows["FusedAdam on CPU"].startswith(CPU_PATHS[found])
    assert rows["kernel detail"] == found.detail


def test_doctor_reports_reference_when_torch_has_no_fused_adam(monkeypatch):
    monkeypatch.setattr(_ext, "status", lambda: _ext.ExtensionStatus("unavailable", "no compiler"))
    monkeypatch.setattr(_torch_fused, "available", lambda device_type: False)
    assert dict(doctor.report())["FusedAdam on CPU"].startswith("pure-torch reference, slow (no apexlite kernel")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the GPU-less wording")
@pytest.mark.parametrize("found, expected", [
    (_ext.ExtensionStatus("installed", "/x/_C.so", cuda=True), "apexlite's compiled kernel (apexlite._C)"),
    (_ext.ExtensionStatus("installed", "/x/_C.so"), "JIT-built on first use when a CUDA toolkit is found"),
    (_ext.ExtensionStatus("disabled", "env"), "torch's fused Adam ops (env)"),
], ids=["built-with-cuda", "cpu-only-build", "disabled"])
def test_doctor_says_what_a_gpu_would_run(monkeypatch, found, expected):
    monkeypatch.setattr(_ext, "status", lambda: found)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    row = dict(doctor.report())["FusedAdam on CUDA"]
    assert row.startswith("n/a here (no GPU visible); on a GPU:") and expected in row


def test_doctor_prints_every_row(capsys):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert all(label in out for label, _ in doctor.report())
