"""The state of apexlite's compiled libraries, found without compiling anything (for loader.py and doctor).

Per library (the CPU library; the CUDA kernel): installed (apexlite._C, compiled at install against this
torch), cached (compiled on first use earlier), buildable (not compiled yet, and this machine can),
incompatible (why not), failed (an earlier compile of these sources for this torch: at install, as
setup.py's record says, or on first use, as the cache folder says), or disabled.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch

from apexlite._native import build_plan as plan
from apexlite._native import jit_build

DISABLE_ENV = plan.DISABLE_ENV
OP_NAME = "apexlite::fused_adam_"
PACKAGE = Path(__file__).resolve().parent.parent  # apexlite/
RECORD = PACKAGE / "_build_record.json"


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
    library: Optional[jit_build.CachedLibrary] = None


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


def has_kernel(dispatch_key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, dispatch_key))
    except RuntimeError:  # the op itself is not registered
        return False


@functools.lru_cache(maxsize=None)
def installed_module() -> Tuple[Optional[types.ModuleType], str]:
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
    library = jit_build.library_for(kind, csrc, toolchain())
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
    if plan.extension_disabled():
        return Finding("disabled", f"{DISABLE_ENV}={os.environ[DISABLE_ENV]} is set")
    module, why = installed_module()
    if module is not None:
        if has_kernel("CPU"):
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
