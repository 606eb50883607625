"""`python -m apexlite doctor [--build]`: what this installation runs, kernel by kernel, and why; in seconds.

For each compiled part (CPU kernel, O1 native casts, CUDA kernel) it says: installed (compiled at
install), JIT-cached (compiled on first use), not compiled yet (and what happens on first use),
incompatible (why), failed (the first compiler error, the log) or disabled. It compiles nothing unless
given ``--build``, which compiles what is missing and possible now. It also names the paths FusedAdam
and O1 take, the toolchain, and where ``import apex`` resolves, without importing apex.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.metadata
import os
import platform
import subprocess
import sys
from typing import List, Optional, Tuple

import torch

from apexlite._native import build_plan as plan
from apexlite._native import jit_build, loader
from apexlite._native import kernel_state as state
from apexlite.help_text import HelpFormatter
from apexlite.optimizers import _torch_fused
from apexlite.switches import help_section

Rows = List[Tuple[str, str]]


def _bf16_support() -> str:
    if not torch.cuda.is_available():
        return "n/a (no GPU)"
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before including_emulation existed
        native = torch.cuda.get_device_capability() >= (8, 0)
    return "native" if native else ("emulated" if torch.cuda.is_bf16_supported() else "unsupported")


def _compiler_version(cxx: Optional[str]) -> str:
    if cxx is None:
        return "not found (install g++ or set CXX)"
    try:
        first = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        first = []
    return f"{first[0] if first else 'unknown version'} ({cxx})"


def _installed_from() -> str:
    checkout = state.PACKAGE.parent
    return f"checkout {checkout}" if (checkout / "setup.py").is_file() else f"installed at {state.PACKAGE}"


def version_text() -> str:
    """`python -m apexlite --version`: apexlite, torch, CUDA and compiler facts in two lines."""
    from apexlite import __version__

    tools = state.toolchain()
    cuda = f"CUDA {tools.torch_cuda}" if tools.torch_cuda else "CPU-only"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
    return (f"apexlite {__version__} ({_installed_from()}), torch {torch.__version__} ({cuda}), "
            f"python {platform.python_version()}\n"
            f"{gpu}; nvcc {nvcc_text(tools)}; C++: {_compiler_version(tools.cxx)}\n")


def nvcc_text(tools: plan.Toolchain) -> str:
    """The nvcc found here and whether this torch needs it: one wording for doctor's row and --version."""
    nvcc, version = tools.nvcc, tools.nvcc_version
    if nvcc is None and not tools.torch_cuda:  # the toolchain looks for nvcc only for a CUDA torch
        nvcc = plan.find_nvcc()
        version = plan.nvcc_release(nvcc) if nvcc else None
    found = f"{version or '(version unknown)'} ({nvcc})" if nvcc else "not found"
    if not tools.torch_cuda:
        return f"{found}, not needed (CPU-only torch)"
    if version and version.split(".")[0] != tools.torch_cuda.split(".")[0]:
        return f"{found}, cannot compile the CUDA kernel: torch was built with CUDA {tools.torch_cuda} (another major)"
    return f"{found}, needed to compile the CUDA kernel (torch built with CUDA {tools.torch_cuda})"


def apex_resolution() -> str:
    """Where `import apex` goes in this process, found without importing apex (a real apex may run code)."""
    from apexlite.compat import hook
    from apexlite.compat.child_path import CHILD_PATH
    from apexlite.compat.install import is_stand_in

    loaded = sys.modules.get("apex")
    if loaded is not None:
        if getattr(loaded, "__name__", "").startswith(hook.COMPAT_PACKAGE):
            return "apexlite (already imported in this process through apexlite's import hook)"
        return f"a real apex, already imported from {getattr(loaded, '__file__', None)}"
    if any(hook.is_apexlite_finder(finder) for finder in sys.meta_path):
        return "apexlite: apexlite.install() (or `python -m apexlite run`) put its import hook in this process"
    spec = importlib.machinery.PathFinder.find_spec("apex", sys.path)
    origin = None if spec is None else (spec.origin or next(iter(spec.submodule_search_locations or []), None))
    if origin is None:
        return ("nothing: no apex is installed (`python -m apexlite alias install`, `apexlite.install()` or "
                "`python -m apexlite run` make it apexlite)")
    if is_stand_in(origin):
        if origin.startswith(CHILD_PATH):
            return "apexlite: this process was started by `apexlite run` or apexlite.install() (child_path)"
        return f"apexlite: the environment alias (`python -m apexlite alias install`) at {origin}"
    try:
        version = importlib.metadata.version("apex")
    except importlib.metadata.PackageNotFoundError:
        version = "(no metadata)"
    return f"a real apex {version} at {origin} (not imported here)"


STATE_WORDS = {"installed": "installed", "cached": "JIT-cached", "buildable": "not compiled yet",
               "incompatible": "incompatible", "failed": "failed", "disabled": "disabled"}


def kernel_text(found: state.Finding, library: str) -> str:
    """One kernel's row: its state word, then why or what happens next."""
    if found.state == "buildable":
        note = plan.first_use_note(library, plan.parallel_jobs(), state.toolchain())
        return f"not compiled yet ({found.detail}); {note}"
    return f"{STATE_WORDS[found.state]}: {found.detail}"


def _torch_has_fused_adam(device_type: str) -> bool:
    """_torch_fused.available runs the op, which needs the device; CUDA's ops exist wherever the names do."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return all(hasattr(torch, name) for name in _torch_fused.OP_NAMES)
    return _torch_fused.available(device_type)


def _fallback(device_type: str) -> str:
    if _torch_has_fused_adam(device_type):
        return "torch's fused Adam ops"
    return f"the pure-torch reference, slow (torch {torch.__version__} has no fused Adam for {device_type})"


def _paths(cpu: state.Finding, cuda: state.Finding) -> Rows:
    """The paths FusedAdam and O1 take now (after a first-use build where one is pending)."""
    from apexlite.amp.o1 import native_casts

    loaded = cpu.state in ("installed", "cached")
    pending = " until the first use compiles apexlite's kernel" if cpu.state == "buildable" else ""
    rows = [("FusedAdam on CPU", "apexlite's compiled kernel" if loaded else _fallback("cpu") + pending)]
    if not torch.version.cuda:
        rows.append(("FusedAdam on CUDA", "n/a (this torch is a CPU-only build)"))
    else:
        gpu = "" if torch.cuda.is_available() else "n/a here (no GPU visible); on a GPU: "
        kernel = cuda.state in ("installed", "cached")
        later = " until the first GPU step compiles apexlite's kernel" if cuda.state == "buildable" else ""
        rows.append(("FusedAdam on CUDA", gpu + ("apexlite's compiled kernel" if kernel else _fallback("cuda") + later)))
    if loaded or cpu.state == "disabled":  # native_casts.status() loads, never compiles, here
        o1 = native_casts.status()
    else:
        o1 = "python" + (" (native once the CPU library is compiled on first use)" if pending else
                         " (the CPU library is not available; see CPU kernel)")
    return rows + [("O1 casts", o1)]


def report() -> Rows:
    """(label, value) rows of the doctor report; compiles nothing."""
    from apexlite import __version__

    tools = state.toolchain()
    cpu = state.find_cpu()
    cpu_status = loader.status() if cpu.state in ("installed", "cached", "disabled") else loader.ExtensionStatus(
        "unavailable", cpu.detail)
    cuda = state.find_cuda(cpu_status)
    csrc = state.kernel_sources()
    rows = [
        ("apexlite", f"{__version__} ({_installed_from()})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("torch", f"{torch.__version__}, " + (f"built with CUDA {tools.torch_cuda}" if tools.torch_cuda else
                                              "CPU-only build")),
        ("GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"),
        ("bfloat16 on GPU", _bf16_support()),
        ("C++ compiler", _compiler_version(tools.cxx)),
        ("nvcc", nvcc_text(tools)),
        ("kernel sources", str(csrc) if csrc else "not part of this install"),
        ("first-use cache", str(jit_build.cache_root())),
        (loader.DISABLE_ENV, os.environ.get(loader.DISABLE_ENV, "unset")),
        ("CPU kernel", kernel_text(cpu, "cpu")),
        ("O1 native casts", f"{STATE_WORDS[cpu.state]} (part of the CPU library)"),
        ("CUDA kernel", kernel_text(cuda, "cuda")),
    ]
    return rows + _paths(cpu, cuda) + [("import apex", apex_resolution())]


def build() -> int:
    """--build: compiles the missing libraries that can be compiled here; 1 when one of them failed."""
    failed = False
    for kind in ("cpu", "cuda"):
        if kind == "cuda" and not torch.version.cuda:
            continue
        outcome = loader.build_now(kind)
        failed |= outcome.said and not outcome.cpu and not outcome.cuda
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    """Prints the report; exit status 0 (it is informational), or 1 when --build could not compile."""
    parser = argparse.ArgumentParser(prog="python -m apexlite doctor", description=__doc__.splitlines()[0],
                                     epilog=help_section("doctor"), formatter_class=HelpFormatter)
    parser.add_argument("--build", action="store_true",
                        help="compile the kernels that are missing and can be compiled here (takes minutes)")
    args = parser.parse_args(argv or [])
    code = build() if args.build else 0
    rows = report()
    width = max(len(label) for label, _ in rows)
    sys.stdout.write("".join(f"{label:<{width}}  {value}\n" for label, value in rows))
    return code
