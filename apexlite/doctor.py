"""`python -m apexlite doctor`: what this installation runs FusedAdam with, and why.

Reports the torch and CUDA versions, whether a GPU is visible and if its bfloat16 is native or
emulated, and which FusedAdam path each device type gets (apexlite's compiled kernel, installed or
JIT-built; torch's fused Adam ops; or the pure-torch reference), with the reason when it is not the
compiled kernel, and whether O1's casting wrappers run in C++ (apexlite._C) or in Python. Running it
loads the kernels (and JIT-builds them where needed, once).
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
from apexlite.amp.o1 import native_casts
from apexlite.optimizers import _torch_fused


def _bf16_support() -> str:
    if not torch.cuda.is_available():
        return "n/a (no GPU)"
    try:
        native = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch before including_emulation existed
        native = torch.cuda.get_device_capability() >= (8, 0)
    return "native" if native else ("emulated" if torch.cuda.is_bf16_supported() else "unsupported")


KERNEL_ORIGINS = {"installed": "apexlite's compiled kernel (apexlite._C)",
                  "jit": "apexlite's compiled kernel (JIT build, cached)"}


def _fallback(device_type: str, why: str) -> str:
    if _torch_fused.available(device_type):
        return f"torch's fused Adam ops (no apexlite kernel: {why})"
    return f"pure-torch reference, slow (no apexlite kernel: {why}; no fused Adam in torch {torch.__version__})"


def _cuda_path(found: _ext.ExtensionStatus) -> str:
    if not torch.cuda.is_available():
        if not torch.version.cuda:
            return "n/a (this torch is a CPU-only build)"
        if found.source == "disabled":
            return f"n/a here (no GPU visible); on a GPU: torch's fused Adam ops ({found.detail})"
        if found.cuda:
            return "n/a here (no GPU visible); on a GPU: apexlite's compiled kernel (apexlite._C)"
        return ("n/a here (no GPU visible); on a GPU: apexlite's CUDA kernel JIT-built on first use when a "
                "CUDA toolkit is found, else torch's fused Adam ops")
    cuda = _ext.cuda_status()
    return KERNEL_ORIGINS[cuda.source] if cuda.cuda else _fallback("cuda", cuda.detail)


def _fused_adam_paths(found: _ext.ExtensionStatus) -> List[Tuple[str, str]]:
    cpu = KERNEL_ORIGINS[found.source] if found.cpu else _fallback("cpu", found.detail)
    rows = [("FusedAdam on CPU", cpu), ("FusedAdam on CUDA", _cuda_path(found)), ("kernel detail", found.detail)]
    if torch.cuda.is_available():
        rows.append(("CUDA kernel detail", _ext.cuda_status().detail))
    return rows


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
    return rows + _fused_adam_paths(_ext.status()) + [("O1 casts", native_casts.status())]


def main(argv: Optional[List[str]] = None) -> int:
    """Prints the report; exit status 0 (it is informational)."""
    parser = argparse.ArgumentParser(prog="python -m apexlite doctor", description=__doc__.splitlines()[0])
    parser.parse_args(argv or [])
    rows = report()
    width = max(len(label) for label, _ in rows)
    sys.stdout.write("".join(f"{label:<{width}}  {value}\n" for label, value in rows))
    return 0
