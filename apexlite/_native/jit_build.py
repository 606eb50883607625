"""First-use builds of apexlite's kernels: one cache folder per library, torch build, interpreter and source.

A folder is ``<root>/apexlite/<library>-torch<version>-<abi>-<sources>`` (plus the nvcc release and GPU
architectures for the CUDA kernel), where root is ``$TORCH_EXTENSIONS_DIR`` or torch's default
(``~/.cache/torch_extensions``). It holds torch's ninja build, the library, ``build.log`` and
``outcome.json``: built (with the seconds it took) or failed (with the first compiler error). A failed
build is not retried on its own (the same sources would fail the same way); ``python -m apexlite
doctor --build`` retries. Concurrent processes (one per GPU) wait on torch's lock in the folder.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import torch

from apexlite._native import build_plan as plan

LIBRARY_NAMES = {"cpu": "apexlite_cpu_kernels", "cuda": "apexlite_cuda_kernels"}
TITLES = {"cpu": "CPU kernels and O1 casts", "cuda": "CUDA kernel"}


def cache_root() -> Path:
    """Where first-use builds go: $TORCH_EXTENSIONS_DIR/apexlite, else torch's default extensions folder.

    Found as torch.utils.cpp_extension finds it, without importing that module (on some torch versions
    its import prints a note about the CUDA runtime, which doctor has no reason to cause)."""
    explicit = os.environ.get("TORCH_EXTENSIONS_DIR")
    if explicit:
        return Path(explicit) / "apexlite"
    try:
        from torch import _appdirs

        default = os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions"))
    except (ImportError, AttributeError):  # a torch without its vendored appdirs
        from torch.utils import cpp_extension

        default = cpp_extension.get_default_build_root()
    return Path(default) / "apexlite"


def cuda_arch_list() -> str:
    """The GPU architectures a CUDA build targets: TORCH_CUDA_ARCH_LIST, else the visible GPUs' (torch's rule)."""
    explicit = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if explicit:
        return explicit
    if not torch.cuda.is_available():
        return ""
    capabilities = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ";".join(f"{major}.{minor}" for major, minor in sorted(capabilities))


@dataclass(frozen=True)
class CachedLibrary:
    """One library's cache folder (it may not exist yet)."""

    kind: str  # "cpu" or "cuda"
    folder: Path

    @property
    def name(self) -> str:
        return LIBRARY_NAMES[self.kind]

    @property
    def path(self) -> Path:
        return self.folder / f"{self.name}.so"

    @property
    def log(self) -> Path:
        return self.folder / "build.log"

    def outcome(self) -> Optional[dict]:
        """{"state": "built"|"failed", ...} of the last build here, or None when there was none."""
        try:
            found = json.loads((self.folder / "outcome.json").read_text())
        except (OSError, ValueError):
            return None
        if found.get("state") == "built" and not self.path.is_file():
            return None  # the library was deleted since
        return found

    def forget_failure(self) -> None:
        outcome = self.outcome()
        if outcome is not None and outcome.get("state") == "failed":
            (self.folder / "outcome.json").unlink()

    def _write_outcome(self, **fields: object) -> None:
        fields["when"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        temporary = self.folder / f"outcome.json.{os.getpid()}"
        temporary.write_text(json.dumps(fields, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, self.folder / "outcome.json")


def library_for(kind: str, csrc: Path, tools: plan.Toolchain) -> CachedLibrary:
    """The cache folder of `kind`'s library for this torch, interpreter, toolkit and source."""
    key = f"{kind}-torch{torch.__version__}-{(torch.version.git_version or '')[:8]}-{plan.abi_tag()}-" \
          f"{plan.source_digest(csrc)}"
    if kind == "cuda":
        key += f"-nvcc{tools.nvcc_version}-sm{cuda_arch_list().replace(';', '_').replace(' ', '_') or 'default'}"
    return CachedLibrary(kind, cache_root() / key.replace("+", "_"))


class BuildFailed(RuntimeError):
    """A first-use build that did not produce its library; the message is one line with the first error."""


def build(library: CachedLibrary, sources: List[Path], include_dirs: List[Path], cuda_home: Optional[str]) -> float:
    """Compiles `sources` into `library` with torch's builder (ninja); returns the seconds it took.
    `cuda_home`: the CUDA toolkit, for the CUDA kernel (None for the CPU library).

    Raises BuildFailed (recorded in the folder, with the compiler's output in build.log) on any failure.
    """
    cuda = cuda_home is not None
    if cuda:  # without CUDA_HOME torch takes nvcc's parent folder for the toolkit; give it the real one
        os.environ.setdefault("CUDA_HOME", cuda_home)
    from torch.utils import cpp_extension

    if cuda:
        cpp_extension.CUDA_HOME = cuda_home  # (in case torch's builder was imported before)
    library.folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(plan.parallel_jobs()))
    started = time.monotonic()
    try:
        cpp_extension.load(
            name=library.name,
            sources=[str(path) for path in sources],
            extra_include_paths=[str(path) for path in include_dirs] + (plan.cuda_include_dirs(cuda_home) if cuda else []),
            extra_cflags=list(plan.CXX_FLAGS),
            extra_cuda_cflags=list(plan.NVCC_FLAGS) if cuda else None,
            extra_ldflags=list(plan.LINK_FLAGS),
            build_directory=str(library.folder),
            is_python_module=False,
            verbose=False,
        )
    except Exception as error:  # compiler, headers, ninja, toolkit: recorded, then the caller falls back
        seconds = time.monotonic() - started
        library.log.write_text(str(error))
        reason = plan.first_error_line(str(error))
        library._write_outcome(state="failed", detail=reason, seconds=round(seconds), log=str(library.log))
        raise BuildFailed(reason) from error
    seconds = time.monotonic() - started
    library._write_outcome(state="built", seconds=round(seconds))
    return seconds
