"""First-use build folders (apexlite/_native/jit_build.py): one per torch, interpreter, toolkit and source; a real
failing compile through torch's builder is recorded with its first error and its log."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from apexlite._native import build_plan as plan
from apexlite._native import jit_build
from tests._native.test_build_plan import CUDA_130_NVCC_130, tools

CSRC = Path(__file__).resolve().parents[2] / "csrc"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path / "apexlite"


def test_cache_folder_is_keyed_by_torch_interpreter_and_source(cache, monkeypatch, tmp_path):
    library = jit_build.library_for("cpu", CSRC, tools())
    assert library.folder.parent == cache and library.path.name == "apexlite_cpu_kernels.so"
    assert plan.abi_tag() in library.folder.name and plan.source_digest(CSRC) in library.folder.name
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    (copy / "torch" / "ops.cpp").write_text((copy / "torch" / "ops.cpp").read_text() + "\n// changed\n")
    assert jit_build.library_for("cpu", copy, tools()).folder != library.folder
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    assert jit_build.library_for("cpu", CSRC, tools()).folder != library.folder


def test_cuda_folder_also_names_the_toolkit_and_architectures(cache, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    library = jit_build.library_for("cuda", CSRC, tools(**CUDA_130_NVCC_130))
    assert library.folder.name.endswith("-nvcc13.0-sm8.0_9.0") and library.name == "apexlite_cuda_kernels"


def test_a_built_outcome_without_its_library_is_no_outcome(cache):
    library = jit_build.library_for("cpu", CSRC, tools())
    library.folder.mkdir(parents=True)
    library._write_outcome(state="built", seconds=1)
    assert library.outcome() is None
    library.path.write_bytes(b"")
    assert library.outcome()["state"] == "built"


@pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja") is None, reason="needs c++ and ninja")
def test_a_real_compile_error_is_recorded_with_its_first_error(cache):
    source = cache.parent / "broken.cpp"
    source.write_text("int f() { return undeclared_name; }\n")
    library = jit_build.CachedLibrary("cpu", cache / "broken")
    with pytest.raises(jit_build.BuildFailed, match=r"broken\.cpp:1:\d+: error: .undeclared_name. was not declared"):
        jit_build.build(library, [source], [], cuda_home=None)
    outcome = library.outcome()
    assert outcome["state"] == "failed" and "undeclared_name" in outcome["detail"]
    assert "undeclared_name" in library.log.read_text()
    library.forget_failure()
    assert library.outcome() is None
