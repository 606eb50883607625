"""Finds apexlite's compiled kernels once per process, compiling them on first use when the install has none.

CPU library (FusedAdam's CPU kernel, the op schema, O1's native casts), the first of:

1. ``apexlite._C``, compiled at install against this torch (setup.py);
2. a first-use build cached for this torch, interpreter and source (apexlite/_native/jit_build.py), loaded at once;
3. a first-use build now, when the sources are here and this machine can compile them: one line on
   stderr before ("compiling apexlite's ... (first use, about N min: <why>)..."; build_time.py), the
   steps done while it runs (build_progress.py), and one line after, with the time.

A build that failed for this torch and source (at install, or at an earlier first use) is not repeated
by itself: it is said once per process, with the compiler's first error, and ``python -m apexlite
doctor --build`` retries it. CUDA kernel: ``apexlite._C`` when the install built it with CUDA
(``APEXLITE_CUDA=1``), else the same steps on the first FusedAdam step on a GPU, when torch has CUDA
and a toolkit of torch's CUDA major version is found. Without a kernel, FusedAdam uses torch's fused
Adam ops (the pure-torch reference where torch has none) and O1 its Python casts.

``APEXLITE_DISABLE_EXTENSION=1`` skips all of it. Nothing happens at import; what exists is found by
apexlite/_native/kernel_state.py, which never compiles (doctor's view).
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import types
import warnings
from pathlib import Path
from typing import Optional, Tuple

import torch

from apexlite._native import build_plan as plan
from apexlite._native import build_progress, build_time, jit_build
from apexlite._native import kernel_state as state
from apexlite._native.kernel_state import ExtensionStatus, Finding
from apexlite._logging import get_logger, is_rank_zero

DISABLE_ENV = plan.DISABLE_ENV
BUILD_HINT = f"`python -m apexlite doctor` says what is missing; `{plan.DOCTOR_BUILD}` compiles the kernels"
FALLBACK = "FusedAdam and O1 use torch's ops instead"

_log = get_logger("ext")


def _load_python_module(path: Path) -> types.ModuleType:
    """A first-use CPU library as a module (its PyInit__C adds the O1 cast types; loading registers the ops)."""
    loader = importlib.machinery.ExtensionFileLoader("apexlite._C", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("apexlite._C", path,
                                                                                     loader=loader))
    loader.exec_module(module)
    return module


def _say(level: int, message: str) -> None:
    _log.log(level if is_rank_zero() else 10, "apexlite: %s", message)


def _build(found: Finding, kind: str) -> Tuple[bool, str]:
    """Compiles `found`'s library, saying before how long it should take here, how far it is while it runs,
    and how long it took after (which the next estimate on this machine uses); (built, detail)."""
    csrc = state.kernel_sources()
    sources = plan.cpu_sources(csrc) if kind == "cpu" else plan.cuda_sources(csrc)
    title = f"apexlite's {jit_build.TITLES[kind]}"
    tools, jobs, history = state.toolchain(), plan.parallel_jobs(), build_time.history_file()
    machine, compiler = build_time.this_machine(jobs), plan.compiler_key(tools, kind)
    expected = build_time.estimate(kind, machine, build_time.read_history(history), torch.__version__, compiler)
    _say(20, f"compiling {title} for torch {torch.__version__} (first use, {expected.about}: {expected.why}; "
             f"cached in {found.library.folder})...")
    progress = build_progress.BuildProgress(found.library.folder, len(sources), f"compiling {title}", expected.about,
                                            lambda line: _say(20, line))
    clock = build_time.Stopwatch()
    try:
        with progress:
            seconds = jit_build.build(found.library, sources, plan.include_dirs(csrc),
                                      tools.cuda_home if kind == "cuda" else None)
    except jit_build.BuildFailed as error:
        _say(30, f"compiling {title} for torch {torch.__version__} failed after {clock.wall():.0f} s: {error}. "
                 f"{FALLBACK}. Log: {found.library.log}; after fixing the cause, `{plan.DOCTOR_BUILD}` retries.")
        return False, f"compiling them failed: {error} (log: {found.library.log})"
    if progress.complete():
        build_time.remember(history, clock.finished(kind, machine, torch.__version__, compiler))
    _say(20, f"compiled {title} in {seconds:.0f} s (estimated: {expected.about}); later runs load them at once")
    return True, f"compiled on first use, cached in {found.library.folder}"


@functools.lru_cache(maxsize=None)
def _cpu_library() -> Tuple[ExtensionStatus, Optional[types.ModuleType]]:
    found = state.find_cpu()
    if found.state == "disabled":
        return ExtensionStatus("disabled", found.detail), None
    if found.state == "installed":
        return ExtensionStatus("installed", found.detail, state.has_kernel("CUDA")), state.installed_module()[0]
    if found.state == "buildable":
        built, detail = _build(found, "cpu")
        if not built:
            return ExtensionStatus("unavailable", detail, said=True), None
        found = Finding("cached", detail, found.library)
    if found.state == "cached":
        return ExtensionStatus("jit", found.detail, state.has_kernel("CUDA")), _load_python_module(found.library.path)
    if found.state == "failed":
        _say(30, f"apexlite's {jit_build.TITLES['cpu']} are not available: {found.detail}. {FALLBACK}.")
        return ExtensionStatus("unavailable", found.detail, said=True), None
    return ExtensionStatus("unavailable", found.detail), None


def status() -> ExtensionStatus:
    """Loads the CPU library on the first call (compiling it first if needed and possible); later calls are free."""
    return _cpu_library()[0]


def native_module() -> Optional[types.ModuleType]:
    """The loaded CPU library as a module (its O1 cast types), or None; see status()."""
    return _cpu_library()[1]


@functools.lru_cache(maxsize=None)
def cuda_status() -> ExtensionStatus:
    """Where the CUDA kernel comes from, compiling it on the first call on a GPU when it can; later calls are free."""
    found = state.find_cuda(status())
    if found.state == "disabled":
        return ExtensionStatus("disabled", found.detail)
    if found.state == "installed":
        return ExtensionStatus(status().source, found.detail, True)
    if found.state in ("cached", "buildable") and not torch.cuda.is_available():
        return ExtensionStatus("unavailable", "no CUDA device is visible")
    if found.state == "buildable":
        built, detail = _build(found, "cuda")
        if not built:
            return ExtensionStatus("unavailable", detail, said=True)
        found = Finding("cached", detail, found.library)
    if found.state == "cached":
        torch.ops.load_library(str(found.library.path))
        if not state.has_kernel("CUDA"):
            return ExtensionStatus("unavailable", f"{found.library.path} registers no CUDA kernel")
        return ExtensionStatus("jit", found.detail, True)
    if found.state == "failed":
        _say(30, f"apexlite's {jit_build.TITLES['cuda']} is not available: {found.detail}. FusedAdam on GPU uses "
                 "torch's fused Adam ops.")
        return ExtensionStatus("unavailable", found.detail, said=True)
    return ExtensionStatus("unavailable", found.detail)


def kernels_available(device_type: str) -> bool:
    """True when a compiled fused_adam_ kernel exists for ``device_type`` ('cpu', 'cuda')."""
    if device_type == "cpu":
        return status().cpu
    return device_type == "cuda" and cuda_status().cuda


def kernel_status(device_type: str) -> ExtensionStatus:
    """The status that decides ``device_type``'s kernel."""
    if device_type == "cuda":
        return cuda_status()
    if device_type == "cpu":
        return status()
    return ExtensionStatus("unavailable", f"apexlite has no kernels for {device_type}")


def kernel_detail(device_type: str) -> str:
    """Where the kernel for ``device_type`` came from, or why there is none."""
    return kernel_status(device_type).detail


@functools.lru_cache(maxsize=None)
def warn_fallback(device_type: str) -> None:
    """Says once per device type that FusedAdam runs the slow pure-torch reference, and how to change that."""
    if status().source == "disabled":  # the user asked for the pure-torch path: nothing to report
        return
    warnings.warn(
        f"apexlite: no compiled FusedAdam kernel for {device_type} ({kernel_detail(device_type)}) and no fused "
        f"Adam in torch {torch.__version__} for it; using the slower pure-torch reference. {BUILD_HINT}.",
        RuntimeWarning,
        stacklevel=3,
    )


def build_now(kind: str) -> ExtensionStatus:
    """Doctor's --build: compiles `kind`'s library ("cpu" or "cuda") now when it is not there, retrying a
    build that failed before; returns the new status."""
    def find() -> Finding:
        return state.find_cpu(retry=True) if kind == "cpu" else state.find_cuda(status(), retry=True)

    found = find()
    if found.state == "failed":  # an earlier first-use build
        found.library.forget_failure()
        found = find()
    if found.state == "buildable":
        if kind == "cuda" and not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            return ExtensionStatus("unavailable", "no CUDA device is visible to compile for (set "
                                                  "TORCH_CUDA_ARCH_LIST, e.g. 9.0, to compile without one)")
        built, detail = _build(found, kind)
        if not built:
            return ExtensionStatus("unavailable", detail, said=True)
    if kind == "cpu":
        _cpu_library.cache_clear()
        return status()
    cuda_status.cache_clear()
    return cuda_status()
