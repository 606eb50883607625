"""Kernel selection: compiled kernel, one-time fallback warning, forced fallback, explicit requests."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from apexlite import _ext
from apexlite.optimizers import FusedAdam, _adam_step


@pytest.fixture
def no_kernels(monkeypatch):
    """Pretends no compiled kernel exists; resets the once-only warning around the test."""
    monkeypatch.setattr(_ext, "kernels_available", lambda device_type: False)
    monkeypatch.setattr(_ext, "status", lambda: _ext.ExtensionStatus("unavailable", "no compiler (test)"))
    _ext.warn_fallback.cache_clear()
    yield
    _ext.warn_fallback.cache_clear()


def _one_step(implementation):
    p = torch.nn.Parameter(torch.randn(8))
    p.grad = torch.randn(8)
    FusedAdam([p], implementation=implementation).step()


def test_fallback_warns_once_with_build_hint(no_kernels):
    with pytest.warns(RuntimeWarning, match="pip install --no-build-isolation"):
        _one_step("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _one_step("auto")


def test_explicit_kernel_request_without_build_raises(no_kernels):
    with pytest.raises(RuntimeError, match="no compiled kernel for cpu"):
        _one_step("kernel")


@pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")
def test_auto_uses_compiled_kernel_when_built():
    assert _adam_step.uses_kernel("auto", torch.device("cpu"))


def test_disable_env_forces_quiet_fallback():
    code = (
        "import warnings, torch; warnings.simplefilter('error');"
        "from apexlite import _ext; from apexlite.optimizers import FusedAdam;"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3); FusedAdam([p]).step();"
        "print(_ext.status().source, float(p.detach()[0]))"
    )
    env = dict(os.environ, **{_ext.DISABLE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    source, value = out.stdout.split()
    assert source == "disabled" and float(value) == pytest.approx(1 - 1e-3)
