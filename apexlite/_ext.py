"""Finds apexlite's compiled kernels once per process, compiling them on first use when the install has none.

CPU library (FusedAdam's CPU kernel, the op schema, O1's native casts), the first of:

1. ``apexlite._C``, compiled at install against this torch (setup.py);
2. a first-use build cached for this torch, interpreter and source (apexlite/_jit_build.py), loaded at once;
3. a first-use build now, when the sources are here and this machine can compile them: one line on
   stderr before ("compiling apexlite's ... (first use, about N min ...)...") and one after, with the time.

A build that failed for this torch and source (at install, or at an earlier first use) is not repeated
by itself: it is said once per process, with the compiler's first error, and ``python -m apexlite
doctor --build`` retries it. CUDA kernel: ``apexlite._C`` when the install built it with CUDA
(``APEXLITE_CUDA=1``), else the same steps on the first FusedAdam step on a GPU, when torch has CUDA
and a toolkit of torch's CUDA major version is found. Without a kernel, FusedAdam uses torch's fused
Adam ops (the pure-torch reference where torch has none) and O1 its Python casts.

``APEXLITE_DISABLE_EXTENSION=1`` skips all of it. Nothing happens at import; :func:`find_cpu` and
:func:`find_cuda` (doctor's view) never compile.
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import os
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch

from apexlite import _build_plan as plan
from apexlite import _jit_build
from apexlite._logging import get_logger, is_rank_zero

DISABLE_ENV = plan.DISABLE_ENV
OP_NAME = "apexlite::fused_adam_"
PACKAGE = Path(__file__).resolve().parent
RECORD = PACKAGE / "_build_record.json"
BUILD_HINT = f"`python -m apexlite doctor` says what is missing; `{plan.DOCTOR_BUILD}` compiles the kernels"
FALLBACK = "FusedAdam and O1 use torch's ops instead"

_log = get_logger("ext")


@dataclass(frozen=True)
class ExtensionStatus:
    """Where a loaded kernel came from (``installed``, ``jit``), or why there is none (``disabled``,
    ``unavailable``). ``said``: the reason was already written to stderr in this process."""

    source: str
    detail: str
    cuda: bool = False  # for status(): whether the same library also registered the CUDA kernel
    said: bool = False

    @property
    def cpu(self) -> bool:
        return self.source in ("installed", "jit")


@dataclass(frozen=True)
class Finding:
    """One library's state without compiling: installed, cached, buildable, incompatible, failed, disabled."""

    state: str
    detail: str
    library: Optional[_jit_build.CachedLibrary] = None


def kernel_sources() -> Optional[Path]:
    """The kernel sources: a checkout's csrc/ (editable install), else the package's _csrc (wheels)."""
    checkout = PACKAGE.parent / "csrc"
    if (PACKAGE.parent / "setup.py").is_file() and plan.is_kernel_tree(checkout):
        return checkout
    packaged = PACKAGE / "_csrc"
    return packaged if plan.is_kernel_tree(packaged) else None


@functools.lru_cache(maxsize=None)
def toolchain() -> plan.Toolchain:
    return plan.probe_toolchain(torch.__version__, torch.version.cuda)


def install_record() -> Optional[dict]:
    """What the install compiled (setup.py's record), when it was made for this torch and interpreter."""
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    if record.get("torch") not in (None, torch.__version__) or record.get("abi") != plan.abi_tag():
        return None  # (torch None: the build had no torch, so nothing in the record depends on one)
    return record


def _record_entry(kind: str) -> dict:
    record = install_record()
    return (record or {}).get(kind) or {}


def _has_kernel(dispatch_key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, dispatch_key))
    except RuntimeError:  # the op itself is not registered
        return False


@functools.lru_cache(maxsize=None)
def _installed_module() -> Tuple[Optional[types.ModuleType], str]:
    """(apexlite._C, '') when the install's library loads with this torch, else (None, why not)."""
    try:
        written = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        written = {}
    if written.get("torch") not in (None, torch.__version__):
        return None, f"the installed apexlite._C was compiled for torch {written['torch']}"
    if importlib.util.find_spec("apexlite._C") is None:
        entry = _record_entry("cpu")
        if entry.get("state") == "not built":
            return None, f"not compiled at install ({entry.get('detail')})"
        return None, "not compiled at install"
    try:
        import apexlite._C as compiled
    except ImportError as error:
        return None, f"the installed apexlite._C does not load ({error})"
    return compiled, ""


def _cached_or_buildable(kind: str, csrc: Path, why: str, retry: bool) -> Finding:
    library = _jit_build.library_for(kind, csrc, toolchain())
    outcome = library.outcome() or {}
    if outcome.get("state") == "built":
        return Finding("cached", f"compiled on first use, cached in {library.folder}", library)
    if outcome.get("state") == "failed":
        return Finding("failed", f"compiling them for torch {torch.__version__} failed on {outcome.get('when')}: "
                                 f"{outcome.get('detail')} (log: {library.log}; after fixing the cause, "
                                 f"`{plan.DOCTOR_BUILD}` retries)", library)
    entry = _record_entry(kind)
    if not retry and entry.get("state") == "failed" and (install_record() or {}).get("sources") == plan.source_digest(csrc):
        return Finding("failed", f"compiling them against torch {torch.__version__} failed at install: "
                                 f"{entry.get('detail')} (after fixing the cause, `{plan.DOCTOR_BUILD}` retries)",
                       library)
    return Finding("buildable", why, library)


def find_cpu(retry: bool = False) -> Finding:
    """The CPU library's state; loads the installed apexlite._C (to know it works), never compiles.
    `retry`: a build that failed at install counts as buildable."""
    if os.environ.get(DISABLE_ENV, "") == "1":
        return Finding("disabled", f"{DISABLE_ENV}=1 is set")
    module, why = _installed_module()
    if module is not None:
        if _has_kernel("CPU"):
            return Finding("installed", f"apexlite._C at {module.__file__}")
        return Finding("incompatible", f"{module.__file__} registers no CPU kernel")
    csrc = kernel_sources()
    if csrc is None:
        return Finding("incompatible", f"{why}, and this install has no kernel sources (reinstall apexlite)")
    obstacle = plan.cpu_obstacle(toolchain(), jit=True)
    found = _cached_or_buildable("cpu", csrc, why, retry)
    if found.state == "buildable" and obstacle:
        return Finding("incompatible", f"{why}; cannot compile them here: {obstacle}", found.library)
    return found


def find_cuda(cpu: ExtensionStatus, retry: bool = False) -> Finding:
    """The CUDA kernel's state, given the CPU library's; never compiles (a GPU is not needed to answer)."""
    if cpu.source == "disabled":
        return Finding("disabled", cpu.detail)
    if cpu.cuda:
        return Finding("installed", f"apexlite._C compiled with CUDA ({cpu.detail})")
    tools = toolchain()
    if not tools.torch_cuda:
        return Finding("incompatible", f"torch {torch.__version__} is a CPU-only build")
    if not cpu.cpu:
        return Finding("incompatible", f"the CPU library it extends is not loaded ({cpu.detail})")
    csrc = kernel_sources()
    if csrc is None:
        return Finding("incompatible", "this install has no kernel sources (reinstall apexlite)")
    found = _cached_or_buildable("cuda", csrc, f"nvcc {tools.nvcc_version} matches torch's CUDA {tools.torch_cuda}",
                                 retry)
    obstacle = plan.cuda_obstacle(tools) or plan.cpu_obstacle(tools, jit=True)
    if found.state == "buildable" and obstacle:
        return Finding("incompatible", obstacle, found.library)
    return found


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
    """Compiles `found`'s library with one line before and one after; (built, detail)."""
    csrc = kernel_sources()
    sources = plan.cpu_sources(csrc) if kind == "cpu" else plan.cuda_sources(csrc)
    title = _jit_build.TITLES[kind]
    jobs = plan.parallel_jobs()
    _say(20, f"compiling apexlite's {title} for torch {torch.__version__} (first use, about "
             f"{plan.estimate_minutes(kind, jobs)} min with {jobs} parallel jobs; cached in {found.library.folder})...")
    started = time.monotonic()
    try:
        seconds = _jit_build.build(found.library, sources, plan.include_dirs(csrc), cuda=kind == "cuda")
    except _jit_build.BuildFailed as error:
        _say(30, f"compiling apexlite's {title} for torch {torch.__version__} failed after "
                 f"{time.monotonic() - started:.0f} s: {error}. {FALLBACK}. Log: {found.library.log}; after fixing "
                 f"the cause, `{plan.DOCTOR_BUILD}` retries.")
        return False, f"compiling them failed: {error} (log: {found.library.log})"
    _say(20, f"compiled apexlite's {title} in {seconds:.0f} s; later runs load them at once")
    return True, f"compiled on first use, cached in {found.library.folder}"


@functools.lru_cache(maxsize=None)
def _cpu_library() -> Tuple[ExtensionStatus, Optional[types.ModuleType]]:
    found = find_cpu()
    if found.state == "disabled":
        return ExtensionStatus("disabled", found.detail), None
    if found.state == "installed":
        return ExtensionStatus("installed", found.detail, _has_kernel("CUDA")), _installed_module()[0]
    if found.state == "buildable":
        built, detail = _build(found, "cpu")
        if not built:
            return ExtensionStatus("unavailable", detail, said=True), None
        found = Finding("cached", detail, found.library)
    if found.state == "cached":
        return ExtensionStatus("jit", found.detail, _has_kernel("CUDA")), _load_python_module(found.library.path)
    if found.state == "failed":
        _say(30, f"apexlite's {_jit_build.TITLES['cpu']} are not available: {found.detail}. {FALLBACK}.")
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
    found = find_cuda(status())
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
        if not _has_kernel("CUDA"):
            return ExtensionStatus("unavailable", f"{found.library.path} registers no CUDA kernel")
        return ExtensionStatus("jit", found.detail, True)
    if found.state == "failed":
        _say(30, f"apexlite's {_jit_build.TITLES['cuda']} is not available: {found.detail}. FusedAdam on GPU uses "
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
        return find_cpu(retry=True) if kind == "cpu" else find_cuda(status(), retry=True)

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
    _cpu_library.cache_clear()
    cuda_status.cache_clear()
    return status() if kind == "cpu" else cuda_status()
