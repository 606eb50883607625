"""Finding, compiling on first use and loading apexlite's kernels (apexlite/_native/loader.py), on a faked machine.

The compiler is faked here (a real first-use build is tests/test_packaging.py's slow fresh-venv test;
a real failing compile is tests/_native/testjit_build.py's): what is checked is which library is chosen, that
a build runs once, what is said (a line before and after a build, one line for a failure, nothing twice)
and that a failure is remembered per torch and source.
"""
from __future__ import annotations

import functools
import json
import logging
import types

import pytest
import torch

from apexlite._native import build_plan as plan
from apexlite._native import build_time, jit_build, loader
from apexlite._native import kernel_state as state
from apexlite._native.cpu_share import Machine
from apexlite.optimizers import _adam_step, _torch_fused
from tests._native.test_build_plan import CUDA_121_NVCC_130, CUDA_130_NVCC_130, tools

CPU_TITLE = jit_build.TITLES["cpu"]


CACHED = [(loader, "_cpu_library"), (loader, "cuda_status"), (loader, "warn_fallback"),
          (_adam_step, "_note_torch_path")]  # what a process finds once


def _clear_caches() -> None:
    """Forgets what this process found (the functions a fixture replaced have no cache to clear)."""
    for cached in [getattr(*where) for where in CACHED] + [state.installed_module, state.toolchain]:
        getattr(cached, "cache_clear", lambda: None)()


def _fresh_caches(monkeypatch) -> None:
    """Empty copies of the process's caches for one test; the real ones, and what they found about this
    machine, come back afterwards for the rest of the suite."""
    for module, name in CACHED:
        monkeypatch.setattr(module, name, functools.lru_cache(maxsize=None)(getattr(module, name).__wrapped__))


class FakeCompiler:
    """Stands in for jit_build.build: records each build and leaves what a real one leaves."""

    def __init__(self, error: str = "") -> None:
        self.error = error
        self.builds = []

    def __call__(self, library, sources, include_dirs, cuda_home):
        self.builds.append((library.kind, [s.name for s in sources], cuda_home))
        library.folder.mkdir(parents=True, exist_ok=True)
        for source in sources:  # the objects ninja writes, one per source (the progress lines count them)
            (library.folder / f"{source.stem}.o").write_bytes(b"")
        if self.error:
            library._write_outcome(state="failed", detail=self.error, seconds=3, log=str(library.log))
            raise jit_build.BuildFailed(self.error)
        library.path.write_bytes(b"")
        library._write_outcome(state="built", seconds=42)
        return 42.0


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A torch 2.13 CPU machine with a compiler, no installed apexlite._C and an empty first-use cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(loader.DISABLE_ENV, raising=False)
    monkeypatch.setattr(state, "RECORD", tmp_path / "_build_record.json")
    monkeypatch.setattr(state, "installed_module", lambda: (None, "not compiled at install"))
    monkeypatch.setattr(state, "toolchain", lambda: tools(torch_version=torch.__version__))
    loaded = types.SimpleNamespace(CastWrapper=object)
    monkeypatch.setattr(loader, "_load_python_module", lambda path: loaded)
    monkeypatch.setattr(state, "has_kernel", lambda key: key == "CPU")
    monkeypatch.setattr(build_time, "this_machine", lambda jobs: Machine(2, 2))  # an idle 2-core machine
    compiler = FakeCompiler()
    monkeypatch.setattr(jit_build, "build", compiler)
    _fresh_caches(monkeypatch)
    return compiler


def _messages(caplog):
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("apexlite")]


def test_first_use_compiles_once_and_says_so_before_and_after(machine, caplog):
    with caplog.at_level(logging.INFO, logger="apexlite"):
        found = loader.status()
        assert loader.status() is found
    assert found.source == "jit" and found.cpu and loader.native_module().CastWrapper is object
    assert machine.builds == [("cpu", [p.name for p in plan.cpu_sources(state.kernel_sources())], None)]
    (level1, before), (level2, after) = _messages(caplog)
    assert before.startswith(f"apexlite: compiling apexlite's {CPU_TITLE} for torch {torch.__version__} (first use, "
                             "about 60 s: 2 cores, 2 jobs, load 0.0; 120 CPU s, measured on the reference machine")
    assert after.startswith(f"apexlite: compiled apexlite's {CPU_TITLE} in 42 s (estimated: about 60 s)")
    assert level1 == level2 == logging.INFO and "fail" not in (before + after).lower()


def test_a_build_is_remembered_and_the_next_estimate_uses_it(machine, caplog, tmp_path):
    loader.status()
    [build] = build_time.read_history(tmp_path / "cache" / "apexlite" / "build_times.json")
    assert (build.library, build.torch, build.compiler) == ("cpu", torch.__version__, tools().cxx)
    assert (build.cores, build.jobs, build.load) == (2, 2, 0.0)
    guess = build_time.estimate_here("cpu", 2, torch.__version__, tools().cxx)
    assert guess.work == build.cpu_seconds and guess.basis == "the last build here with this compiler and torch"


def test_a_later_process_loads_the_cached_build_quietly(machine, caplog):
    loader.status()
    _clear_caches()  # a new process, as far as the loader can tell
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="apexlite"):
        found = loader.status()
    assert found.source == "jit" and "cached in" in found.detail
    assert len(machine.builds) == 1 and _messages(caplog) == []
    assert state.find_cpu().state == "cached"


def test_a_build_error_is_said_once_then_remembered(machine, caplog, monkeypatch):
    machine.error = "csrc/torch/o1_cast_table.cpp:120:5: error: 'any_modes_set' is not a member"
    monkeypatch.setattr(_torch_fused, "available", lambda device_type: True)
    with caplog.at_level(logging.INFO, logger="apexlite"):
        found = loader.status()
        assert _adam_step.resolve("auto", torch.device("cpu")) == "torch"  # no second line about it
    assert not found.cpu and found.said
    said = _messages(caplog)
    [(level, message)] = [m for m in said if "fail" in m[1]]
    assert len(said) == 2 and said[0][1].startswith("apexlite: compiling") and said[0][0] == logging.INFO
    assert level == logging.WARNING and machine.error in message
    assert "FusedAdam and O1 use torch's ops instead" in message and plan.DOCTOR_BUILD in message
    caplog.clear()
    _clear_caches()  # the next process does not compile the same failing sources again
    with caplog.at_level(logging.INFO, logger="apexlite"):
        assert not loader.status().cpu
    assert len(machine.builds) == 1
    [(level, message)] = _messages(caplog)
    assert level == logging.WARNING and "failed on" in message and machine.error in message
    assert state.find_cpu().state == "failed"


def test_doctor_build_retries_after_a_build_error(machine):
    machine.error = "error: something"
    assert not loader.status().cpu
    machine.error = ""
    assert loader.build_now("cpu").source == "jit"
    assert len(machine.builds) == 2 and state.find_cpu().state == "cached"


def _write_record(machine_record, cpu_state, detail="", torch_version=None):
    machine_record.write_text(json.dumps({
        "torch": torch_version or torch.__version__, "abi": plan.abi_tag(),
        "sources": plan.source_digest(state.kernel_sources()),
        "cpu": {"state": cpu_state, "detail": detail}, "cuda": {"state": "not built", "detail": ""}}))


def test_a_compile_that_failed_at_install_is_not_repeated_on_first_use(machine, caplog):
    _write_record(state.RECORD, "failed", "ops.cpp:1: error: boom")
    with caplog.at_level(logging.INFO, logger="apexlite"):
        found = loader.status()
    assert not found.cpu and machine.builds == []
    [(level, message)] = _messages(caplog)
    assert "failed at install: ops.cpp:1: error: boom" in message and plan.DOCTOR_BUILD in message
    assert loader.build_now("cpu").source == "jit" and len(machine.builds) == 1


def test_a_record_of_other_sources_does_not_block_first_use(machine):
    _write_record(state.RECORD, "failed", "error: old")
    record = json.loads(state.RECORD.read_text())
    state.RECORD.write_text(json.dumps(dict(record, sources="0" * 16)))
    assert loader.status().source == "jit" and len(machine.builds) == 1


@pytest.mark.parametrize("facts, expected", [
    (dict(cxx=None), "no C++ compiler found"),
    (dict(ninja=False), "ninja is not installed"),
], ids=["no-compiler", "no-ninja"])
def test_nothing_is_compiled_where_it_cannot_be(machine, monkeypatch, caplog, facts, expected):
    monkeypatch.setattr(state, "toolchain", lambda: tools(torch_version=torch.__version__, **facts))
    with caplog.at_level(logging.INFO, logger="apexlite.ext"):
        found = loader.status()
    assert not found.cpu and not found.said and expected in found.detail and "not compiled at install" in found.detail
    assert machine.builds == [] and _messages(caplog) == [] and state.find_cpu().state == "incompatible"


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])  # read like the install switches
def test_disabled_compiles_and_loads_nothing(machine, monkeypatch, value):
    monkeypatch.setenv(loader.DISABLE_ENV, value)
    assert loader.status().source == "disabled" and loader.native_module() is None and machine.builds == []


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_an_off_value_leaves_the_library_on(machine, monkeypatch, value):
    monkeypatch.setenv(loader.DISABLE_ENV, value)
    assert state.find_cpu().state != "disabled"


def test_kernel_sources_of_a_checkout_and_of_a_wheel(monkeypatch, tmp_path):
    monkeypatch.delenv(loader.DISABLE_ENV, raising=False)  # the suite may run with it set
    assert state.kernel_sources() is None or plan.is_kernel_tree(state.kernel_sources())
    package = tmp_path / "site-packages" / "apexlite"
    monkeypatch.setattr(state, "PACKAGE", package)
    assert state.kernel_sources() is None
    (package / "_csrc" / "torch").mkdir(parents=True)
    (package / "_csrc" / "torch" / "ops.cpp").write_text("")
    assert state.kernel_sources() == package / "_csrc"
    monkeypatch.setattr(state, "kernel_sources", lambda: None)
    monkeypatch.setattr(state, "installed_module", lambda: (None, "not compiled at install"))
    found = state.find_cpu()
    assert found.state == "incompatible" and "no kernel sources" in found.detail


def test_an_installed_library_of_another_torch_is_not_loaded(monkeypatch, tmp_path):
    _write_record(tmp_path / "record.json", "built", torch_version="1.0.0")
    monkeypatch.setattr(state, "RECORD", tmp_path / "record.json")
    state.installed_module.cache_clear()
    try:
        assert state.installed_module() == (None, "the installed apexlite._C was compiled for torch 1.0.0")
    finally:
        state.installed_module.cache_clear()


def test_an_installed_library_has_its_record():
    module, _ = state.installed_module()
    if module is None:
        pytest.skip("apexlite._C is not installed here")
    record = state.install_record()
    assert record is not None and record["cpu"]["state"] == "built" and record["torch"] == torch.__version__


@pytest.fixture
def gpu_machine(machine, monkeypatch):
    """The same, with a CUDA 13.0 torch, nvcc 13.0 and a GPU; the CPU library installed without CUDA."""
    registered = {"CPU": True, "CUDA": False}
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(state, "toolchain", lambda: tools(**CUDA_130_NVCC_130))
    monkeypatch.setattr(loader, "_cpu_library", lambda: (loader.ExtensionStatus("installed", "/x/_C.so"), None))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch.ops, "load_library", lambda path: registered.update(CUDA=True))
    monkeypatch.setattr(state, "has_kernel", lambda key: registered[key])
    return machine


def test_cuda_kernel_is_compiled_once_on_first_gpu_use(gpu_machine):
    assert loader.kernels_available("cuda") and loader.kernels_available("cuda")
    assert gpu_machine.builds == [("cuda", ["flat_gather_cuda.cpp", "fused_adam_cuda.cpp", "flat_gather.cu",
                                             "fused_adam.cu", "fused_adam_flat.cu", "fused_adam_flat_table.cu"],
                                   "/usr/local/cuda")]
    found = loader.cuda_status()
    assert found.source == "jit" and "cached in" in found.detail and found.detail.endswith("-nvcc13.0-sm9.0")


@pytest.mark.parametrize("change, expected", [
    ("mismatch", "nvcc 13.0 (/usr/local/bin/nvcc) does not match the CUDA 12.4 torch was built with"),
    ("cpu_torch", "is a CPU-only build"),
    ("no_toolkit", "no CUDA toolkit found"),
    ("no_gpu", "no CUDA device is visible"),
])
def test_cuda_kernel_is_not_compiled_without_what_it_needs(gpu_machine, monkeypatch, change, expected):
    if change == "mismatch":
        monkeypatch.setattr(state, "toolchain", lambda: tools(**CUDA_121_NVCC_130))
    elif change == "cpu_torch":
        monkeypatch.setattr(state, "toolchain", lambda: tools())
    elif change == "no_toolkit":
        monkeypatch.setattr(state, "toolchain", lambda: tools(**dict(CUDA_130_NVCC_130, nvcc=None, nvcc_version=None)))
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not loader.kernels_available("cuda")
    assert gpu_machine.builds == [] and expected in loader.kernel_detail("cuda")
