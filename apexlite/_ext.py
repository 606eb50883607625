"""Finds apexlite's native kernels once per process and says where each device's kernel comes from.

CPU kernel, in order of preference:

1. ``apexlite._C``, built by ``pip install --no-build-isolation -e .`` when torch was importable;
2. a JIT build of ``csrc/`` on first use, cached by torch in ``$TORCH_EXTENSIONS_DIR`` (default
   ``~/.cache/torch_extensions``), so later runs load it at once.

CUDA kernel: ``apexlite._C`` when it was built with CUDA; otherwise, on the first FusedAdam step on a
GPU, a JIT build of ``csrc/cuda`` when torch has CUDA and a CUDA toolkit is found (nvcc, CUDA_HOME),
cached the same way. Without a kernel FusedAdam uses torch's fused Adam ops, or the pure-torch
reference where torch has none (:mod:`apexlite.optimizers._adam_step`).

``APEXLITE_DISABLE_EXTENSION=1`` skips all of it. Nothing is loaded at import time: the first
FusedAdam step, ``python -m apexlite doctor`` or :func:`status` triggers the search.
"""
from __future__ import annotations

import functools
import glob
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List

import torch

from apexlite._logging import get_logger

DISABLE_ENV = "APEXLITE_DISABLE_EXTENSION"
OP_NAME = "apexlite::fused_adam_"
CSRC = Path(__file__).resolve().parent.parent / "csrc"
JIT_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")  # as setup.py
JIT_NVCC_FLAGS = ("-O3", "--fmad=false")  # as setup.py
BUILD_HINT = (
    "build the kernels with `pip install --no-build-isolation -e .` from an apexlite checkout "
    "(needs a C++ compiler; the CUDA kernel also needs a CUDA build of torch and nvcc/CUDA_HOME), "
    "then check `python -m apexlite doctor`"
)

_log = get_logger("ext")


@dataclass(frozen=True)
class ExtensionStatus:
    """Where a kernel came from (``installed``, ``jit``, ``disabled`` or ``unavailable``) and why."""

    source: str
    detail: str
    cuda: bool = False  # for status(): whether the same library also registered the CUDA kernel

    @property
    def cpu(self) -> bool:
        return self.source in ("installed", "jit")


def cpu_sources() -> List[Path]:
    """csrc/torch/*.cpp except the CUDA bindings (*_cuda.cpp): the CPU library (setup.py's rule too)."""
    return sorted(p for p in (CSRC / "torch").glob("*.cpp") if not p.name.endswith("_cuda.cpp"))


def cuda_sources() -> List[Path]:
    """The CUDA bindings (csrc/torch/*_cuda.cpp) and kernels (csrc/cuda/*.cu)."""
    return sorted((CSRC / "torch").glob("*_cuda.cpp")) + sorted((CSRC / "cuda").glob("*.cu"))


def _has_kernel(dispatch_key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, dispatch_key))
    except RuntimeError:  # the op itself is not registered
        return False


def _pip_cuda_includes() -> List[str]:
    """Headers of pip's CUDA wheels (nvidia/cu*/include), which CUDA builds of torch include (as setup.py)."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    return sorted(path for root in roots for path in glob.glob(os.path.join(root, "cu*", "include")))


def _jit_build(name: str, sources: List[Path], cuda: bool) -> str:
    """Compiles ``sources`` with torch's JIT extension builder (cached); returns the cache folder."""
    from torch.utils import cpp_extension

    missing = [str(s) for s in sources if not s.is_file()]
    if missing or not sources:
        raise FileNotFoundError(f"kernel sources are not part of this install: {missing or 'csrc/'}")
    _log.info("apexlite: compiling the FusedAdam %s kernel from csrc/ on first use (a minute or more; cached "
              "afterwards)", "CUDA" if cuda else "CPU")
    includes = [str(CSRC / "include"), str(CSRC / "torch"), str(CSRC / "cuda")]
    cpp_extension.load(
        name=name,
        sources=[str(s) for s in sources],
        extra_include_paths=includes + (_pip_cuda_includes() if cuda else []),
        extra_cflags=list(JIT_FLAGS),
        extra_cuda_cflags=list(JIT_NVCC_FLAGS) if cuda else None,
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
        verbose=False,
    )
    return cpp_extension._get_build_directory(name, verbose=False)


@functools.lru_cache(maxsize=None)
def status() -> ExtensionStatus:
    """Loads the CPU kernel (and the op schema) on the first call and reports the outcome; later calls are free."""
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
        folder = _jit_build("apexlite_cpu_kernels", cpu_sources(), cuda=False)
    except Exception as error:  # no compiler, no sources, failed compile: all end in the fallback
        return ExtensionStatus("unavailable", f"{installed_error}; JIT build failed: {error}")
    return ExtensionStatus("jit", f"JIT-built CPU kernel in {folder}", _has_kernel("CUDA"))


def _cuda_jit_obstacle(found: ExtensionStatus) -> str:
    """Why the CUDA kernel cannot be JIT-built here ('' when it can)."""
    if not found.cpu:
        return f"no apexlite library is loaded to extend ({found.detail})"
    if not torch.version.cuda:
        return "this torch is a CPU-only build"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        return "no CUDA toolkit found for a JIT build (put nvcc on PATH or set CUDA_HOME)"
    return ""


@functools.lru_cache(maxsize=None)
def cuda_status() -> ExtensionStatus:
    """Where the CUDA kernel comes from, JIT-building it on the first call when it can; later calls are free."""
    found = status()
    if found.source == "disabled":
        return found
    if found.cuda:
        return ExtensionStatus(found.source, f"{found.detail} (built with CUDA)", True)
    obstacle = _cuda_jit_obstacle(found)
    built_without = "apexlite._C was built without CUDA" if found.source == "installed" else found.detail
    if obstacle:
        return ExtensionStatus("unavailable", f"{built_without}; {obstacle}")
    try:
        folder = _jit_build("apexlite_cuda_kernels", cuda_sources(), cuda=True)
    except Exception as error:  # compiler or toolkit trouble: torch's fused ops remain
        return ExtensionStatus("unavailable", f"{built_without}; JIT build of the CUDA kernel failed: {error}")
    if not _has_kernel("CUDA"):
        return ExtensionStatus("unavailable", f"{built_without}; the JIT-built library in {folder} registers no "
                                              "CUDA kernel")
    return ExtensionStatus("jit", f"JIT-built CUDA kernel in {folder}", True)


def kernels_available(device_type: str) -> bool:
    """True when a compiled fused_adam_ kernel exists for ``device_type`` ('cpu', 'cuda')."""
    if device_type == "cpu":
        return status().cpu
    return device_type == "cuda" and cuda_status().cuda


def kernel_detail(device_type: str) -> str:
    """Where the kernel for ``device_type`` came from, or why there is none."""
    if device_type == "cpu":
        return status().detail
    if device_type == "cuda":
        return cuda_status().detail
    return f"apexlite has no kernels for {device_type}"


@functools.lru_cache(maxsize=None)
def warn_fallback(device_type: str) -> None:
    """Says once per device type that FusedAdam runs the slow pure-torch reference, and how to change that."""
    if status().source == "disabled":  # the user asked for the pure-torch path: nothing to report
        return
    warnings.warn(
        f"apexlite: no compiled FusedAdam kernel for {device_type} ({kernel_detail(device_type)}) and no fused "
        f"Adam in torch {torch.__version__} for it; using the slower pure-torch reference. To fix: {BUILD_HINT}.",
        RuntimeWarning,
        stacklevel=3,
    )
