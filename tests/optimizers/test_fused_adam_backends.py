"""Path selection: compiled kernel, torch's fused ops, the reference (with its one-time warning), explicit requests."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

from apexlite._native import loader as _ext
from apexlite.optimizers import FusedAdam, _adam_step, _torch_fused, fused_adam_step


@pytest.fixture
def no_kernels(monkeypatch):
    """Pretends no compiled kernel exists; resets the once-only messages around the test."""
    monkeypatch.setattr(_ext, "kernels_available", lambda device_type: False)
    monkeypatch.setattr(_ext, "status", lambda: _ext.ExtensionStatus("unavailable", "no compiler (test)"))
    _ext.warn_fallback.cache_clear()
    _adam_step._note_torch_path.cache_clear()
    yield
    _ext.warn_fallback.cache_clear()
    _adam_step._note_torch_path.cache_clear()


@pytest.fixture
def no_torch_fused(monkeypatch):
    """Pretends this torch has no fused Adam kernels (torch before 2.4 on CPU)."""
    monkeypatch.setattr(_torch_fused, "available", lambda device_type: False)


def _one_step(implementation):
    p = torch.nn.Parameter(torch.randn(8))
    p.grad = torch.randn(8)
    FusedAdam([p], implementation=implementation).step()


needs_torch_fused = pytest.mark.skipif(not _torch_fused.available("cpu"), reason="this torch has no fused Adam on CPU")


@needs_torch_fused
def test_without_kernel_auto_takes_torch_fused_ops_quietly(no_kernels, caplog):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.INFO, logger="apexlite"):
            _one_step("auto")
            _one_step("auto")
    notes = [r.getMessage() for r in caplog.records if "torch's fused Adam ops" in r.getMessage()]
    assert len(notes) == 1 and "no compiler (test)" in notes[0]
    assert _adam_step.resolve("auto", torch.device("cpu")) == "torch"


def test_reference_fallback_warns_once_with_build_hint(no_kernels, no_torch_fused):
    with pytest.warns(RuntimeWarning, match="python -m apexlite doctor"):
        _one_step("auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _one_step("auto")
    assert _adam_step.resolve("auto", torch.device("cpu")) == "reference"


def test_explicit_kernel_request_without_build_raises(no_kernels):
    with pytest.raises(RuntimeError, match="no compiled kernel for cpu"):
        _one_step("kernel")


def test_explicit_torch_request_without_torch_support_raises(no_torch_fused):
    with pytest.raises(RuntimeError, match="no fused Adam kernel for cpu"):
        _one_step("torch")


@pytest.mark.skipif(not _ext.kernels_available("cpu"), reason="compiled CPU kernel not built")
def test_auto_uses_compiled_kernel_when_built():
    assert _adam_step.uses_kernel("auto", torch.device("cpu"))


@pytest.mark.parametrize("implementation", ["kernel", "torch", "reference"])
def test_functional_step_reports_the_path_it_took(implementation):
    if implementation == "kernel" and not _ext.kernels_available("cpu"):
        pytest.skip("compiled CPU kernel not built")
    if implementation == "torch" and not _torch_fused.available("cpu"):
        pytest.skip("this torch has no fused Adam on CPU")
    lists = [[torch.ones(3)], [torch.ones(3)], [torch.zeros(3)], [torch.zeros(3)], [torch.zeros(())], []]
    path = fused_adam_step(*lists, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                           bias_correction=True, adam_w_mode=True, implementation=implementation)
    assert path == implementation
    torch.testing.assert_close(lists[0][0], torch.full((3,), 0.9))  # first Adam step: lr * sign(grad)
    assert float(lists[4][0]) == 1.0


def test_disable_env_forces_quiet_torch_or_reference_path():
    code = (
        "import warnings, torch; warnings.simplefilter('error');"
        "from apexlite._native import loader as _ext; from apexlite.optimizers import FusedAdam, _adam_step;"
        "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3); FusedAdam([p]).step();"
        "print(_ext.status().source, _adam_step.resolve('auto', p.device), float(p.detach()[0]))"
    )
    env = dict(os.environ, **{_ext.DISABLE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    source, path, value = out.stdout.split()
    assert source == "disabled" and float(value) == pytest.approx(1 - 1e-3)
    assert path == ("torch" if _torch_fused.available("cpu") else "reference")
