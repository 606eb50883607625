"""`python -m apexlite doctor`: what this installation runs FusedAdam with, and why.

Reports the torch and CUDA versions, whether a GPU is visible and if its bfloat16 is native or
emulated, and which FusedAdam path each device type gets (compiled kernel, JIT build or the
pure-torch fallback), with the reason when it is the fallback.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
from typing import List, Optional, Tuple

import torch

from apexlite import _ext


def _bf16_support() -> str:
    if not torch.cuda.is_available():
        return "n/a (no GPU)"
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before including_emulation existed
        native = torch.cuda.get_device_capability() >= (8, 0)
    return "native" if native else ("emulated" if torch.cuda.is_bf16_supported() else "unsupported")


def _fused_adam_paths(found: _ext.ExtensionStatus) -> List[Tuple[str, str]]:
    kernels = {"installed": "compiled kernel (apexlite._C)", "jit": "compiled kernel (JIT build, cached)"}
    cpu = kernels.get(found.source, "pure-torch fallback")
    if found.source == "disabled":
        cuda = "pure-torch fallback"
    elif found.cuda:
        cuda = "compiled CUDA kernel (apexlite._C)"
    else:
        cuda = "pure-torch fallback (apexlite._C was built without CUDA)"
    return [("FusedAdam on CPU", cpu), ("FusedAdam on CUDA", cuda), ("kernel detail", found.detail)]


def report() -> List[Tuple[str, str]]:
    """(label, value) rows of the doctor report; loads (or JIT-builds) the kernels if not done yet."""
    from apexlite import __version__

    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = shutil.which("nvcc") or (os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None)
    rows = [
        ("apexlite", __version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("torch built with CUDA", torch.version.cuda or "no (CPU-only build)"),
        ("GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"),
        ("bfloat16 on GPU", _bf16_support()),
        ("nvcc", nvcc if nvcc and os.path.exists(nvcc) else "not found"),
        (_ext.DISABLE_ENV, os.environ.get(_ext.DISABLE_ENV, "unset")),
    ]
    return rows + _fused_adam_paths(_ext.status())


def main(argv: Optional[List[str]] = None) -> int:
    """Prints the report; exit status 0 (it is informational)."""
    parser = argparse.ArgumentParser(prog="python -m apexlite doctor", description=__doc__.splitlines()[0])
    parser.parse_args(argv or [])
    rows = report()
    width = max(len(label) for label, _ in rows)
    sys.stdout.write("".join(f"{label:<{width}}  {value}\n" for label, value in rows))
    return 0
