"""The CUDA kernels' own source (csrc/cuda/fused_adam.cu, fused_adam_flat.cu, fused_adam_flat_table.cu,
flat_gather.cu) built for the CPU with g++ and called via ctypes.

``csrc/cuda/host_emulation.h`` stands in for the CUDA built-ins; every launch runs each block and
thread serially (see that header for why this is exact). The library is built once per source
version into a private cache folder (``$XDG_CACHE_HOME/apexlite/cuda-host-emulation``, default
``~/.cache``) and reused, so only the first test session pays the few seconds of compiling.
Only g++ is needed: no CUDA toolkit, no torch headers.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest
import torch

CSRC = Path(__file__).resolve().parents[2] / "csrc"
SOURCES = ("cuda/fused_adam.cu", "cuda/fused_adam_flat.cu", "cuda/fused_adam_flat_table.cu", "cuda/flat_gather.cu",
           "cuda/host_emulation_entry.cpp")
# -ffp-contract=off as setup.py's CPU kernel flags: no fused multiply-adds, so every float operation
# rounds as written and the two host builds can be compared bit for bit.
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-DAPEXLITE_CUDA_HOST_EMULATION",
         "-Wall", "-Wextra", "-Wno-unknown-pragmas")
KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # apexlite::cuda::FloatKind
LAUNCH_LOG_CAPACITY = 1 << 16


class CompilerMissing(RuntimeError):
    """No C++ compiler to build the emulation library (the tests skip)."""


def _compiler() -> str:
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise CompilerMissing(f"{compiler} not found (set CXX to a C++17 compiler)")
    return compiler


def _private_cache() -> Path:
    """A cache folder only this user can write to (a shared one could hand us a planted library)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "apexlite" / "cuda-host-emulation"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = root.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise PermissionError(f"{root} must belong to you and not be writable by others (chmod 700 {root})")
    return root


def _digest(compiler: str) -> str:
    """Names one build: every header and source under csrc/cuda and csrc/include, the flags, the compiler."""
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    digest.update(version.encode())
    for path in sorted(p for folder in ("cuda", "include") for p in (CSRC / folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(CSRC)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def build() -> Path:
    """Path of the emulation library, compiled first if this source version has not been built yet."""
    compiler = _compiler()
    target = _private_cache() / f"libapexlite_cuda_host_{_digest(compiler)}.so"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        output = Path(scratch) / target.name
        command = [compiler, *FLAGS, f"-I{CSRC / 'include'}", f"-I{CSRC / 'cuda'}",
                   "-x", "c++", *[str(CSRC / source) for source in SOURCES[:-1]], "-x", "none", str(CSRC / SOURCES[-1]),
                   "-o", str(output)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CUDA host emulation failed:\n{' '.join(command)}\n{result.stderr}")
        os.replace(output, target)  # atomic: concurrent test sessions never load a half-written file
    return target


def _pointers(tensors: Sequence[torch.Tensor]):
    return (ctypes.c_void_p * max(len(tensors), 1))(*[t.data_ptr() for t in tensors])


class EmulatedKernels:
    """``fused_adam_``, ``fused_adam_flat_``, ``fused_adam_flat_grad_list_`` and ``flat_gather_`` run by the CUDA
    kernels' code on CPU tensors."""

    def __init__(self, path: Path) -> None:
        self._lib = ctypes.CDLL(str(path))
        self._lib.apexlite_emulated_fused_adam.restype = ctypes.c_int
        self._lib.apexlite_emulated_fused_adam.argtypes = (
            [ctypes.c_void_p] * 6 + [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int] * 4
            + [ctypes.c_double] * 5 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int])
        self._lib.apexlite_emulated_fused_adam_flat.restype = ctypes.c_int
        self._lib.apexlite_emulated_fused_adam_flat.argtypes = (
            [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 4
            + [ctypes.c_double] * 5 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int])
        self._lib.apexlite_emulated_fused_adam_flat_grad_table.restype = ctypes.c_int
        self._lib.apexlite_emulated_fused_adam_flat_grad_table.argtypes = (
            [ctypes.c_void_p] * 4 + [ctypes.c_int64] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
            + [ctypes.c_double] * 5 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int])
        self._lib.apexlite_emulated_flat_gather.restype = ctypes.c_int
        self._lib.apexlite_emulated_flat_gather.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
        self._lib.apexlite_emulated_take_launches.restype = ctypes.c_int64
        self._lib.apexlite_emulated_take_launches.argtypes = [ctypes.c_void_p, ctypes.c_int64]

    def fused_adam_(self, params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
                    exp_avg_sqs: List[torch.Tensor], state_steps: List[torch.Tensor],
                    model_copies: List[torch.Tensor], *, lr: float, beta1: float, beta2: float, eps: float,
                    weight_decay: float, bias_correction: bool, adam_w_mode: bool,
                    grad_scale: Optional[torch.Tensor] = None, found_inf: Optional[torch.Tensor] = None,
                    unscale_grads: bool = False) -> None:
        """Runs launch_fused_adam on the tensors' memory; raises on a launch error (a bad dtype mix)."""
        lists = (params, grads, exp_avgs, exp_avg_sqs, state_steps, model_copies)
        for tensor in (t for lst in lists for t in lst):
            assert tensor.device.type == "cpu" and tensor.is_contiguous(), "contiguous CPU tensors only"
        numels = (ctypes.c_int64 * max(len(params), 1))(*[p.numel() for p in params])
        first = lambda lst, default=torch.float32: lst[0].dtype if lst else default  # noqa: E731
        error = self._lib.apexlite_emulated_fused_adam(
            _pointers(params), _pointers(grads), _pointers(exp_avgs), _pointers(exp_avg_sqs),
            _pointers(model_copies) if model_copies else None, _pointers(state_steps), numels, len(params),
            KINDS[first(params)], KINDS[first(grads)], KINDS[first(exp_avgs)],
            KINDS[first(model_copies, torch.float16)], lr, beta1, beta2, eps, weight_decay,
            int(bias_correction), int(adam_w_mode),
            None if grad_scale is None else grad_scale.data_ptr(),
            None if found_inf is None else found_inf.data_ptr(), int(unscale_grads))
        if error != 0:
            raise RuntimeError(f"emulated launch_fused_adam returned cudaError {error}")

    def fused_adam_flat_(self, param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                         exp_avg_sq: torch.Tensor, steps: torch.Tensor, model_copy: Optional[torch.Tensor], *,
                         lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                         bias_correction: bool, adam_w_mode: bool, grad_scale: Optional[torch.Tensor] = None,
                         found_inf: Optional[torch.Tensor] = None, unscale_grads: bool = False) -> None:
        """Runs launch_fused_adam_flat on the buffers' memory (1-D CPU tensors); raises on a launch error."""
        buffers = [t for t in (param, grad, exp_avg, exp_avg_sq, steps, model_copy) if t is not None]
        for tensor in buffers:
            assert tensor.device.type == "cpu" and tensor.dim() == 1 and tensor.is_contiguous(), "1-D CPU buffers only"
        error = self._lib.apexlite_emulated_fused_adam_flat(
            param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
            None if model_copy is None else model_copy.data_ptr(), steps.data_ptr(), param.numel(), steps.numel(),
            KINDS[param.dtype], KINDS[grad.dtype], KINDS[exp_avg.dtype],
            KINDS[torch.float16 if model_copy is None else model_copy.dtype], lr, beta1, beta2, eps, weight_decay,
            int(bias_correction), int(adam_w_mode), None if grad_scale is None else grad_scale.data_ptr(),
            None if found_inf is None else found_inf.data_ptr(), int(unscale_grads))
        if error != 0:
            raise RuntimeError(f"emulated launch_fused_adam_flat returned cudaError {error}")

    def fused_adam_flat_grad_list_(self, param: torch.Tensor, grads: List[torch.Tensor], offsets: torch.Tensor,
                                   exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, steps: torch.Tensor,
                                   model_copy: Optional[torch.Tensor], *, lr: float, beta1: float, beta2: float,
                                   eps: float, weight_decay: float, bias_correction: bool, adam_w_mode: bool,
                                   grad_scale: Optional[torch.Tensor] = None, found_inf: Optional[torch.Tensor] = None,
                                   unscale_grads: bool = False) -> None:
        """What fused_adam_flat_grad_list_'s CUDA binding launches: launch_fused_adam_flat_table over the
        buffers (1-D CPU tensors), each grad (dense, read where it is) at its offset; raises on a launch error."""
        for tensor in (t for t in (param, exp_avg, exp_avg_sq, steps, model_copy) if t is not None):
            assert tensor.device.type == "cpu" and tensor.dim() == 1 and tensor.is_contiguous(), "1-D CPU buffers only"
        count = max(len(grads), 1)
        error = self._lib.apexlite_emulated_fused_adam_flat_grad_table(
            param.data_ptr(), (ctypes.c_uint64 * count)(*[g.data_ptr() for g in grads]),
            (ctypes.c_int64 * count)(*offsets.tolist()), (ctypes.c_int64 * count)(*[g.numel() for g in grads]),
            len(grads), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), None if model_copy is None else model_copy.data_ptr(),
            steps.data_ptr(), KINDS[param.dtype], KINDS[grads[0].dtype if grads else torch.float32],
            KINDS[exp_avg.dtype], KINDS[torch.float16 if model_copy is None else model_copy.dtype], lr, beta1, beta2,
            eps, weight_decay, int(bias_correction), int(adam_w_mode),
            None if grad_scale is None else grad_scale.data_ptr(), None if found_inf is None else found_inf.data_ptr(),
            int(unscale_grads))
        if error != 0:
            raise RuntimeError(f"emulated launch_fused_adam_flat_table returned cudaError {error}")

    def flat_gather_(self, flat: torch.Tensor, sources: List[torch.Tensor], offsets: List[int]) -> None:
        """Runs launch_flat_gather: each (dense, flat-dtype) source's memory to flat[offset:offset + numel]."""
        size = flat.element_size()
        count = max(len(sources), 1)
        error = self._lib.apexlite_emulated_flat_gather(
            flat.data_ptr(), (ctypes.c_uint64 * count)(*[s.data_ptr() for s in sources]),
            (ctypes.c_int64 * count)(*[o * size for o in offsets]),
            (ctypes.c_int64 * count)(*[s.numel() * size for s in sources]), len(sources))
        if error != 0:
            raise RuntimeError(f"emulated launch_flat_gather returned cudaError {error}")

    def take_launches(self) -> List[Tuple[int, int]]:
        """(blocks, threads) of every launch since the last call, in order."""
        buffer = (ctypes.c_int32 * (2 * LAUNCH_LOG_CAPACITY))()
        count = self._lib.apexlite_emulated_take_launches(buffer, LAUNCH_LOG_CAPACITY)
        assert count <= LAUNCH_LOG_CAPACITY, "launch log overflow"
        return [(buffer[2 * i], buffer[2 * i + 1]) for i in range(count)]


@functools.lru_cache(maxsize=None)
def kernels() -> EmulatedKernels:
    """The emulation library of the current sources, built on first use."""
    return EmulatedKernels(build())


def kernels_or_skip() -> EmulatedKernels:
    """`kernels()` with an empty launch log, or the calling test skipped where g++ is missing."""
    try:
        emulated = kernels()
    except CompilerMissing as missing:
        pytest.skip(str(missing))
    emulated.take_launches()
    return emulated
