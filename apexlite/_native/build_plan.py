"""What apexlite compiles, with which flags, and whether this machine can: one answer for setup.py, the
first-use (JIT) build and ``python -m apexlite doctor``, so the three never disagree.

Standard library only: setup.py loads this file by path, before apexlite (or even torch) is importable.
Facts about the machine are gathered once into a :class:`Toolchain`; every decision is a pure function
of those facts and the environment, so tests drive them with fakes.

Two compiled libraries:

* the CPU library: every csrc/torch/*.cpp except the CUDA bindings; FusedAdam's CPU kernel, the op
  schema and O1's native casts. Installed as ``apexlite._C`` or JIT-built on first use.
* the CUDA kernel: csrc/torch/*_cuda.cpp and csrc/cuda/*.cu. Joins ``apexlite._C`` only when the
  install is asked for it (``APEXLITE_CUDA=1``); otherwise it is JIT-built on the first FusedAdam step
  on a GPU, as a second library that registers into the CPU library's op.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Tuple

from . import build_time, cpu_share  # relative: setup.py loads this package on its own, without apexlite

# -g0: no debug information. The interpreter's default CFLAGS carry -g, which more than doubles the
# compile time of the torch-header-heavy sources (BENCHMARKS.md, "Building the kernels").
# -fopenmp: at::parallel_for is header code that runs serially unless the library itself is built with
# OpenMP. -ffp-contract=off (and nvcc's --fmad=false): no fused multiply-adds, every float operation of
# adam_math.h rounds as written, so the CPU kernel, the CUDA kernel and its host emulation agree bit for bit.
CXX_FLAGS: Tuple[str, ...] = ("-O3", "-g0", "-fno-math-errno", "-ffp-contract=off", "-fopenmp")
NVCC_FLAGS: Tuple[str, ...] = ("-O3", "-std=c++17", "--fmad=false")
LINK_FLAGS: Tuple[str, ...] = ("-fopenmp",)

BUILD_ENV = "APEXLITE_BUILD_EXTENSION"      # "0": the install compiles nothing
CUDA_ENV = "APEXLITE_CUDA"                  # "1": the install also compiles the CUDA kernel
REQUIRE_ENV = "APEXLITE_REQUIRE_EXTENSION"  # "1": a kernel the install meant to build and did not fails it
DISABLE_ENV = "APEXLITE_DISABLE_EXTENSION"  # "1": at run time, use no compiled code at all
DOCTOR_BUILD = "python -m apexlite doctor --build"


ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("0", "false", "no", "off")


def switch_on(name: str, default: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """An on/off environment switch ("1", "true", "yes", "on" / "0", "false", "no", "off"; unset or empty:
    `default`). Any other value is refused, naming the switch: a typo must not quietly mean off."""
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(f"{name}={raw!r} is neither on nor off: set it to 1 to turn it on, or to 0 (or unset it) "
                     f"to turn it off")


def extension_disabled() -> bool:
    """APEXLITE_DISABLE_EXTENSION is on."""
    return switch_on(DISABLE_ENV)


def cpu_sources(csrc: Path) -> List[Path]:
    """csrc/torch/*.cpp except the CUDA bindings (*_cuda.cpp): the CPU library. A new op needs no edit here."""
    return sorted(p for p in (csrc / "torch").glob("*.cpp") if not p.name.endswith("_cuda.cpp"))


def cuda_sources(csrc: Path) -> List[Path]:
    """The CUDA bindings (csrc/torch/*_cuda.cpp) and kernels (csrc/cuda/*.cu)."""
    return sorted((csrc / "torch").glob("*_cuda.cpp")) + sorted((csrc / "cuda").glob("*.cu"))


def include_dirs(csrc: Path) -> List[Path]:
    return [csrc / "include", csrc / "torch", csrc / "cuda"]


def is_kernel_tree(path: Path) -> bool:
    """Whether `path` holds apexlite's kernel sources (the op schema file marks them)."""
    return (path / "torch" / "ops.cpp").is_file()


def source_digest(csrc: Path) -> str:
    """Hash of every file under csrc/ and of the flags: which sources a build was made from."""
    digest = hashlib.sha256(repr((CXX_FLAGS, NVCC_FLAGS, LINK_FLAGS)).encode())
    for path in sorted(p for p in csrc.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(csrc).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


MIN_SETUPTOOLS = 77  # pyproject.toml's license is an SPDX string (PEP 639), which older setuptools refuse


def setuptools_obstacle(version: str) -> Optional[str]:
    """Why this setuptools cannot build apexlite (a --no-build-isolation install uses the environment's own),
    or None. pip's isolated builds fetch a new enough one from pyproject's build requirements."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    if major >= MIN_SETUPTOOLS:
        return None
    return (f"building apexlite needs setuptools >= {MIN_SETUPTOOLS} (pyproject.toml's license is an SPDX string), "
            f"this environment has {version}: `pip install -U setuptools`, or install without --no-build-isolation")


def parallel_jobs(environ: Mapping[str, str] = os.environ) -> int:
    """Compile jobs: MAX_JOBS when set, else the cores this process may use (ninja's default, cores + 2,
    only adds memory and contention: each job needs about 1 GiB for torch's headers)."""
    value = environ.get("MAX_JOBS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return cpu_share.usable_cores()


@dataclass(frozen=True)
class Toolchain:
    """What this machine offers for building the kernels (probed once; tests build their own)."""

    torch_version: Optional[str]   # None: torch is not importable (pip's build isolation at install)
    torch_cuda: Optional[str]      # torch.version.cuda; None for a CPU-only torch
    cxx: Optional[str]             # the C++ compiler's path
    python_headers: bool           # Python.h, which csrc/torch/ops.cpp includes
    ninja: bool                    # the JIT build needs ninja; the install only runs faster with it
    nvcc: Optional[str] = None
    nvcc_version: Optional[str] = None  # "13.0"
    cuda_home: Optional[str] = None     # the toolkit folder (bin/nvcc, include/cuda_runtime_api.h)


def nvcc_release(nvcc: str) -> Optional[str]:
    """The "release X.Y" of `nvcc --version`, or None when it cannot be run or read."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def is_cuda_toolkit(root: str) -> bool:
    """Whether `root` is a CUDA toolkit: nvcc in bin/ and the runtime's headers in include/."""
    return (os.path.isfile(os.path.join(root, "bin", "nvcc"))
            and os.path.isfile(os.path.join(root, "include", "cuda_runtime_api.h")))


def find_cuda_home(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The CUDA toolkit's folder: $CUDA_HOME or $CUDA_PATH when set, else the first real toolkit of nvcc's
    folder (resolving links) and /usr/local/cuda. Unlike torch's guess (nvcc's parent folder), an nvcc
    that is a wrapper script elsewhere on PATH does not make a folder without CUDA's headers the toolkit."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(variable):
            return environ[variable]
    on_path = shutil.which("nvcc", path=environ.get("PATH"))
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(on_path)))] if on_path else []
    return next((root for root in candidates + ["/usr/local/cuda"] if is_cuda_toolkit(root)), None)


def find_nvcc(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The toolkit's nvcc, else whichever nvcc is on PATH (its version is still worth reporting)."""
    home = find_cuda_home(environ)
    if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc", path=environ.get("PATH"))


def probe_toolchain(torch_version: Optional[str], torch_cuda: Optional[str],
                    environ: Mapping[str, str] = os.environ) -> Toolchain:
    """The real machine's toolchain for a torch of `torch_version` (None: torch not importable)."""
    cxx = shutil.which(environ.get("CXX") or "c++")
    headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    nvcc = find_nvcc(environ) if torch_cuda else None
    home = find_cuda_home(environ) if torch_cuda else None
    return Toolchain(torch_version, torch_cuda, cxx, headers, shutil.which("ninja") is not None,
                     nvcc, nvcc_release(nvcc) if nvcc else None, home if home and is_cuda_toolkit(home) else None)


def cpu_obstacle(tools: Toolchain, jit: bool = False) -> str:
    """Why the CPU library cannot be compiled here ('' when it can). `jit`: for a build at run time."""
    if tools.torch_version is None:
        return ("torch was not importable by the build (pip builds in an isolated environment unless given "
                "--no-build-isolation)")
    if tools.cxx is None:
        return "no C++ compiler found (install g++ or set CXX)"
    if not tools.python_headers:
        return (f"Python's C headers are missing ({sysconfig.get_paths()['include']}/Python.h; install your "
                "distribution's python3-dev)")
    if jit and not tools.ninja:
        return "ninja is not installed (pip install ninja)"
    return ""


def cuda_obstacle(tools: Toolchain) -> str:
    """Why the CUDA kernel cannot be compiled here ('' when it can), GPU or not."""
    if tools.torch_version is None:
        return "torch was not importable by the build"
    if not tools.torch_cuda:
        return f"torch {tools.torch_version} is a CPU-only build"
    if tools.nvcc is None:
        return "no CUDA toolkit found (put nvcc on PATH or set CUDA_HOME)"
    if tools.nvcc_version is None:
        return f"{tools.nvcc} does not report its version"
    if tools.cuda_home is None:
        return (f"no CUDA headers found for {tools.nvcc} (include/cuda_runtime_api.h): set CUDA_HOME to the "
                "CUDA toolkit's folder")
    if tools.nvcc_version.split(".")[0] != tools.torch_cuda.split(".")[0]:
        major = tools.torch_cuda.split(".")[0]
        return (f"nvcc {tools.nvcc_version} ({tools.nvcc}) does not match the CUDA {tools.torch_cuda} torch was "
                f"built with, and torch refuses another major version: put a CUDA {major}.x toolkit first on "
                f"PATH (or CUDA_HOME), or use a torch built for CUDA {tools.nvcc_version.split('.')[0]}")
    return cpu_obstacle(tools)


@dataclass(frozen=True)
class Decision:
    """Whether the install compiles one library, and the one line that says so when it does not."""

    build: bool
    why_not: str = ""


@dataclass(frozen=True)
class InstallPlan:
    cpu: Decision
    cuda: Decision
    require: bool  # APEXLITE_REQUIRE_EXTENSION=1: what the plan builds must build, and the CPU library must be planned


def install_plan(tools: Toolchain, environ: Mapping[str, str] = os.environ) -> InstallPlan:
    """What `pip install` compiles: the CPU library whenever it can, the CUDA kernel only when asked."""
    require = switch_on(REQUIRE_ENV, environ=environ)
    if not switch_on(BUILD_ENV, default=True, environ=environ):
        off = Decision(False, f"{BUILD_ENV}={environ[BUILD_ENV].strip()}")
        return InstallPlan(off, off, require)
    obstacle = cpu_obstacle(tools)
    cpu = Decision(not obstacle, obstacle)
    if not switch_on(CUDA_ENV, environ=environ):
        why = "" if not tools.torch_cuda else f"the install compiles it only with {CUDA_ENV}=1"
        return InstallPlan(cpu, Decision(False, why), require)
    obstacle = cuda_obstacle(tools) or ("" if cpu.build else "the CPU library it extends is not built")
    return InstallPlan(cpu, Decision(not obstacle, obstacle), require)


def first_use_note(library: str, jobs: int, tools: Optional[Toolchain] = None) -> str:
    """What happens to a library that is not compiled yet (the install's and doctor's wording), with how long
    compiling it should take here (`tools`: the toolchain it would use, to match this machine's past builds)."""
    where = "on the first FusedAdam step or O1 session" if library == "cpu" else "on the first FusedAdam step on a GPU"
    expected = build_time.estimate_here(library, jobs, tools.torch_version if tools else None,
                                        compiler_key(tools, library) if tools else None)
    return f"compiled {where}, once per torch version ({expected.about} here, cached), or now with `{DOCTOR_BUILD}`"


def compiler_key(tools: Toolchain, library: str) -> Optional[str]:
    """The compilers a build of `library` uses, as the build-time history tells builds apart."""
    if "cuda" in library:
        return f"{tools.cxx} + nvcc {tools.nvcc_version}"
    return tools.cxx


def first_error_line(log: str) -> str:
    """The compiler's first error from a build log (or its last non-empty line), for one-line reports."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"\berror\b", line) and not line.startswith(("FAILED:", "ninja:", "subprocess")):
            return re.sub(r"^\S*/(?=_?csrc/)", "", line)[:300]  # the source's path from csrc/ on
    return lines[-1][:300] if lines else "no output"


def abi_tag() -> str:
    """The interpreter ABI a compiled library belongs to (cpython-311-x86_64-linux-gnu)."""
    return sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag


def cuda_include_dirs(cuda_home: Optional[str]) -> List[str]:
    """The toolkit's headers first, then pip's CUDA wheels' (nvidia/cu*/include: cuBLAS, cuSPARSE... which
    CUDA builds of torch include and a bare toolkit may lack), so the toolkit's own win where both have one."""
    return ([os.path.join(cuda_home, "include")] if cuda_home else []) + pip_cuda_includes()


def pip_cuda_includes() -> List[str]:
    """Headers of pip's CUDA wheels (nvidia/cu*/include)."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    return sorted(path for root in roots for path in glob.glob(os.path.join(root, "cu*", "include")))
