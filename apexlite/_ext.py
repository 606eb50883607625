"""Finds apexlite's native kernels once per process and says which FusedAdam path is active.

Order of preference:

1. ``apexlite._C``, built by ``pip install --no-build-isolation -e .`` when torch was importable;
2. a JIT build of the CPU kernel from ``csrc/`` on first use, cached by torch in
   ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), so later runs load it at once;
3. the pure-torch path in :mod:`apexlite.optimizers._reference`, with one warning.

``APEXLITE_DISABLE_EXTENSION=1`` skips 1 and 2 (the pure-torch path, without a warning). Nothing is
loaded at import time: the first FusedAdam step, ``python -m apexlite doctor`` or :func:`status`
triggers the search.
"""
from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from apexlite._logging import get_logger

DISABLE_ENV = "APEXLITE_DISABLE_EXTENSION"
OP_NAME = "apexlite::fused_adam_"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
JIT_SOURCES = ("torch/ops.cpp", "torch/fused_adam_cpu.cpp")
JIT_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")  # as setup.py
BUILD_HINT = (
    "build the kernels with `pip install --no-build-isolation -e .` from an apexlite checkout "
    "(needs a C++ compiler; the CUDA kernel also needs a CUDA build of torch and nvcc/CUDA_HOME), "
    "then check `python -m apexlite doctor`"
)

_log = get_logger("ext")


@dataclass(frozen=True)
class ExtensionStatus:
    """Where the kernels came from (``installed``, ``jit``, ``disabled`` or ``unavailable``) and why."""

    source: str
    detail: str
    cuda: bool = False

    @property
    def cpu(self) -> bool:
        return self.source in ("installed", "jit")


def _has_kernel(dispatch_key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, dispatch_key))
    except RuntimeError:  # the op itself is not registered
        return False


def _jit_build() -> str:
    """Compiles the CPU kernel with torch's JIT extension builder; returns the cache folder."""
    from torch.utils import cpp_extension

    sources = [CSRC / s for s in JIT_SOURCES]
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise FileNotFoundError(f"kernel sources are not part of this install: {missing}")
    _log.info("apexlite: loading the FusedAdam CPU kernel from csrc/ (compiled on first use, about a "
              "minute; cached afterwards)")
    cpp_extension.load(
        name="apexlite_cpu_kernels",
        sources=[str(s) for s in sources],
        extra_include_paths=[str(CSRC / "include"), str(CSRC / "torch")],
        extra_cflags=list(JIT_FLAGS),
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )
    return cpp_extension._get_build_directory("apexlite_cpu_kernels", verbose=False)


@functools.lru_cache(maxsize=None)
def status() -> ExtensionStatus:
    """Loads the kernels on the first call and reports the outcome; later calls are free."""
    if os.environ.get(DISABLE_ENV, "") == "1":
        return ExtensionStatus("disabled", f"{DISABLE_ENV}=1 is set")
    try:
        import apexlite._C as compiled
    except ImportError as error:
        installed_error = f"apexlite._C not importable ({error})"
    else:
        if _has_kernel("CPU"):
            return ExtensionStatus("installed", str(compiled.__file__), _has_kernel("CUDA"))
        installed_error = f"{compiled.__file__} registers no CPU kernel"
    try:
        folder = _jit_build()
    except Exception as error:  # no compiler, no sources, failed compile: all end in the fallback
        return ExtensionStatus("unavailable", f"{installed_error}; JIT build failed: {error}")
    return ExtensionStatus("jit", f"JIT-built CPU kernel in {folder}", _has_kernel("CUDA"))


def kernels_available(device_type: str) -> bool:
    """True when a compiled fused_adam_ kernel exists for ``device_type`` ('cpu', 'cuda')."""
    found = status()
    return found.cpu if device_type == "cpu" else found.cuda if device_type == "cuda" else False


@functools.lru_cache(maxsize=None)
def warn_fallback(device_type: str) -> None:
    """Says once per device type that FusedAdam runs the pure-torch path, and how to change that."""
    found = status()
    if found.source == "disabled":  # the user asked for the pure-torch path: nothing to report
        return
    warnings.warn(
        f"apexlite: no compiled FusedAdam kernel for {device_type} ({found.detail}); using the slower "
        f"pure-torch path. To fix: {BUILD_HINT}.",
        RuntimeWarning,
        stacklevel=3,
    )
