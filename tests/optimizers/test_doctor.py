"""`python -m apexlite doctor` names the FusedAdam path that is really active."""
from __future__ import annotations

import pytest
import torch

from apexlite import _ext, doctor

# extension status -> what the doctor must say about FusedAdam on the CPU
CPU_PATHS = {
    _ext.ExtensionStatus("installed", "/x/_C.so"): "compiled kernel (apexlite._C)",
    _ext.ExtensionStatus("jit", "cache"): "compiled kernel (JIT build, cached)",
    _ext.ExtensionStatus("unavailable", "no compiler"): "pure-torch fallback",
    _ext.ExtensionStatus("disabled", "env"): "pure-torch fallback",
}


@pytest.mark.parametrize("found", list(CPU_PATHS), ids=lambda s: s.source)
def test_doctor_reports_cpu_path(monkeypatch, found):
    monkeypatch.setattr(_ext, "status", lambda: found)
    rows = dict(doctor.report())
    assert rows["FusedAdam on CPU"] == CPU_PATHS[found]
    assert rows["kernel detail"] == found.detail


def test_doctor_prints_every_row(capsys):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert all(label in out for label, _ in doctor.report())
