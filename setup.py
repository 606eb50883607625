"""Build script: apexlite is pure Python plus an optional native extension, ``apexlite._C``.

The extension holds the FusedAdam kernels. It is built only when torch is importable at build time
(install with ``pip install --no-build-isolation`` so the installed torch is used, never a downloaded
one). The CPU kernel is always part of it; the CUDA kernel joins when ``APEXLITE_CUDA`` is ``1``, or on
``auto`` (the default) when torch was built with CUDA and a CUDA toolkit is found. A failed native
build never fails the install: apexlite then JIT-builds the CPU kernel on first use or falls back to
pure torch (see apexlite/_ext.py and ``python -m apexlite doctor``); ``APEXLITE_REQUIRE_EXTENSION=1``
turns a failed native build into an error (CI uses it). ``TORCH_CUDA_ARCH_LIST`` defaults to 9.0.
"""
import glob
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
# Source rule (apexlite/_ext.py's JIT build uses the same): every csrc/torch/*.cpp is CPU code except the
# CUDA bindings, named *_cuda.cpp, which join csrc/cuda/*.cu in the CUDA build. A new op needs no edit here.
CPU_SOURCES = sorted(p for p in glob.glob("csrc/torch/*.cpp") if not p.endswith("_cuda.cpp"))
CUDA_SOURCES = sorted(glob.glob("csrc/torch/*_cuda.cpp")) + sorted(glob.glob("csrc/cuda/*.cu"))
# -fopenmp: at::parallel_for is header code that runs serially unless the extension itself is built with OpenMP.
# -ffp-contract=off (and nvcc's --fmad=false): no fused multiply-adds, every float operation of adam_math.h
# rounds as written, so the CPU kernel, the CUDA kernel and its host emulation agree bit for bit.
CXX_FLAGS = ["-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false"]
LINK_FLAGS = ["-fopenmp"]


def _wants_cuda(torch_cuda_version, cuda_home):
    choice = os.environ.get("APEXLITE_CUDA", "auto").lower()
    if choice in ("0", "false", "no"):
        return False
    if choice in ("1", "true", "yes"):
        return True
    # A machine may have nvcc next to a CPU-only torch: nvcc alone must not switch the CUDA build on.
    return bool(torch_cuda_version) and cuda_home is not None


def _pip_cuda_includes():
    """Headers of pip's CUDA wheels (nvidia/cu*/include): CUDA builds of torch need them, bare nvcc lacks them."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    return sorted(path for root in roots for path in glob.glob(os.path.join(root, "cu*", "include")))


def _native_build():
    """(ext_modules, cmdclass) for the extension, or empty ones when torch is not importable."""
    if os.environ.get("APEXLITE_BUILD_EXTENSION", "1") == "0":
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return [], {}

    class OptionalBuildExtension(cpp_extension.BuildExtension):
        """Reports a failed native build and carries on, so the install still succeeds."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as error:  # compiler missing or failing: the pure-torch path remains
                if os.environ.get("APEXLITE_REQUIRE_EXTENSION") == "1":
                    raise
                self.warn(f"apexlite: building {ext.name} failed ({error}); FusedAdam will JIT-build "
                          "its CPU kernel on first use or fall back to pure torch.")

    include_dirs = [os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc", "torch")]
    if _wants_cuda(torch.version.cuda, cpp_extension.CUDA_HOME):
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        ext = cpp_extension.CUDAExtension(
            "apexlite._C", CPU_SOURCES + CUDA_SOURCES, include_dirs=include_dirs + _pip_cuda_includes(),
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS}, extra_link_args=LINK_FLAGS,
        )
    else:
        ext = cpp_extension.CppExtension(
            "apexlite._C", CPU_SOURCES, include_dirs=include_dirs, extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
        )
    return [ext], {"build_ext": OptionalBuildExtension}


ext_modules, cmdclass = _native_build()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
