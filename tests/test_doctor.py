"""`python -m apexlite doctor`: each compiled part's state and why, the paths FusedAdam and O1 take, where
`import apex` goes; all without compiling (`--build` compiles) and without importing apex."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from apexlite import cli, doctor
from apexlite._native import jit_build, loader
from apexlite._native import kernel_state as state
from apexlite.compat import hook
from apexlite.optimizers import _torch_fused
from tests._native.test_build_plan import CUDA_121_NVCC_130, CUDA_130_NVCC_130, tools

FALLBACK = "torch's fused Adam ops" if _torch_fused.available("cpu") else "the pure-torch reference, slow"
LIBRARY = jit_build.CachedLibrary("cpu", Path("/cache/cpu-x"))

# CPU library finding -> (CPU kernel row starts with, FusedAdam on CPU row starts with, O1 casts row starts with)
CPU_ROWS = {
    "installed": (state.Finding("installed", "apexlite._C at /x/_C.so"), "installed: apexlite._C at /x/_C.so",
                  "apexlite's compiled kernel", None),
    "cached": (state.Finding("cached", "compiled on first use, cached in /c", LIBRARY), "JIT-cached: compiled on",
               "apexlite's compiled kernel", None),
    "buildable": (state.Finding("buildable", "not compiled at install (torch was not importable by the build)", LIBRARY),
                  "not compiled yet (not compiled at install (torch was not importable by the build)); compiled on "
                  "the first FusedAdam step or O1 session, once per torch version (about",
                  f"{FALLBACK} until the first use compiles apexlite's kernel", "python (native once"),
    "incompatible": (state.Finding("incompatible", "cannot compile them here: no C++ compiler found"),
                     "incompatible: cannot compile them here: no C++ compiler found", FALLBACK,
                     "python (the CPU library is not available"),
    "failed": (state.Finding("failed", "compiling them failed on 2026-11-25: x.cpp:1: error: y", LIBRARY),
               "failed: compiling them failed on 2026-11-25: x.cpp:1: error: y", FALLBACK,
               "python (the CPU library is not available"),
}


@pytest.fixture
def no_compiling(monkeypatch):
    """Any compile attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("doctor compiled something")

    monkeypatch.setattr(jit_build, "build", refuse)


@pytest.mark.parametrize("found_state", list(CPU_ROWS))
def test_cpu_rows(monkeypatch, no_compiling, found_state):
    found, kernel, fused_adam, o1 = CPU_ROWS[found_state]
    monkeypatch.setattr(state, "find_cpu", lambda retry=False: found)
    if found_state in ("installed", "cached"):
        monkeypatch.setattr(loader, "status", lambda: loader.ExtensionStatus("installed", "x"))
    rows = dict(doctor.report())
    assert rows["CPU kernel"].startswith(kernel)
    assert rows["O1 native casts"].startswith(doctor.STATE_WORDS[found_state])
    assert rows["FusedAdam on CPU"].startswith(fused_adam)
    if o1 is not None:
        assert rows["O1 casts"].startswith(o1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the GPU-less wording")
@pytest.mark.parametrize("found, kernel, path", [
    (state.Finding("installed", "apexlite._C compiled with CUDA (x)"), "installed: ", "apexlite's compiled kernel"),
    (state.Finding("buildable", "not compiled yet", LIBRARY), "not compiled yet (not compiled yet); compiled on the "
     "first FusedAdam step on a GPU", "until the first GPU step compiles apexlite's kernel"),
    (state.Finding("incompatible", "nvcc 13.0 (/usr/bin/nvcc) does not match the CUDA 12.1 torch was built with"),
     "incompatible: nvcc 13.0", "torch's fused Adam ops"),
], ids=["installed", "buildable", "mismatch"])
def test_cuda_rows_without_a_gpu(monkeypatch, no_compiling, found, kernel, path):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(_torch_fused, "available", lambda device_type: True)
    monkeypatch.setattr(state, "find_cuda", lambda cpu, retry=False: found)
    rows = dict(doctor.report())
    assert rows["CUDA kernel"].startswith(kernel)
    assert rows["FusedAdam on CUDA"].startswith("n/a here (no GPU visible); on a GPU: ") and path in rows["FusedAdam on CUDA"]


def test_doctor_prints_every_row_and_compiles_nothing(capsys, no_compiling):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out
    assert all(label in out for label, _ in doctor.report())


@pytest.mark.parametrize("built, code", [(True, 0), (False, 1)])
def test_doctor_build_compiles_what_is_missing(monkeypatch, capsys, built, code):
    asked = []

    def build_now(kind):
        asked.append(kind)
        return loader.ExtensionStatus("jit", "x") if built else loader.ExtensionStatus("unavailable", "error", said=True)

    monkeypatch.setattr(loader, "build_now", build_now)
    assert doctor.main(["--build"]) == code
    assert asked == (["cpu", "cuda"] if torch.version.cuda else ["cpu"])


def _apex_tree(root, body: str):
    (root / "apex").mkdir()
    (root / "apex" / "__init__.py").write_text(body)
    return root


def test_import_apex_resolves_to_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "apex" not in p])
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    if any(hook.is_apexlite_finder(f) for f in sys.meta_path):
        pytest.skip("this process has apexlite's import hook")
    if doctor.importlib.machinery.PathFinder.find_spec("apex", sys.path) is not None:
        pytest.skip("an apex is installed in this environment")
    assert doctor.apex_resolution().startswith("nothing: no apex is installed")


def test_a_real_apex_is_named_without_being_imported(monkeypatch, tmp_path):
    root = _apex_tree(tmp_path, "raise RuntimeError('a real apex must not be imported by doctor')\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    where = doctor.apex_resolution()
    assert where.startswith("a real apex") and str(root / "apex") in where and "apex" not in sys.modules


def test_the_environment_alias_is_recognised(monkeypatch, tmp_path):
    from apexlite.compat import alias

    root = _apex_tree(tmp_path, alias.STAND_IN.format(name="apex"))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    assert doctor.apex_resolution().startswith("apexlite: the environment alias (`python -m apexlite alias install`)")


def test_the_hook_of_install_is_recognised(monkeypatch):
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    with hook.apex_aliases():
        assert doctor.apex_resolution().startswith("apexlite: apexlite.install()")


def test_version_names_apexlite_torch_and_the_toolchain(capsys):
    from apexlite import __version__

    assert cli.main(["--version"]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith(f"apexlite {__version__} (") and f"torch {torch.__version__}" in first
    assert "nvcc" in second and "C++" in second


NVCC = "/usr/local/cuda/bin/nvcc"
# (torch's CUDA, the nvcc the toolchain found for it, the nvcc on PATH for a CPU-only torch) -> nvcc's words
NVCC_CASES = [
    ("cpu-torch-nvcc-found", dict(), NVCC, "13.0 (/usr/local/cuda/bin/nvcc), not needed (CPU-only torch)"),
    ("cpu-torch-no-nvcc", dict(), None, "not found, not needed (CPU-only torch)"),
    ("cuda-torch-match", CUDA_130_NVCC_130, None,
     "13.0 (/usr/local/bin/nvcc), needed to compile the CUDA kernel (torch built with CUDA 13.0)"),
    ("cuda-torch-mismatch", CUDA_121_NVCC_130, None,
     "13.0 (/usr/local/bin/nvcc), cannot compile the CUDA kernel: torch was built with CUDA 12.4 (another major)"),
    ("cuda-torch-no-nvcc", dict(CUDA_130_NVCC_130, nvcc=None, nvcc_version=None, cuda_home=None), None,
     "not found, needed to compile the CUDA kernel (torch built with CUDA 13.0)"),
]


@pytest.mark.parametrize("facts, on_path, words", [case[1:] for case in NVCC_CASES], ids=[c[0] for c in NVCC_CASES])
def test_doctor_and_version_say_the_same_about_nvcc(monkeypatch, no_compiling, facts, on_path, words):
    monkeypatch.setattr(state, "toolchain", lambda: tools(**facts))
    monkeypatch.setattr(doctor.plan, "find_nvcc", lambda environ=None: on_path)
    monkeypatch.setattr(doctor.plan, "nvcc_release", lambda nvcc: "13.0" if nvcc == NVCC else None)
    monkeypatch.setattr(state, "find_cuda", lambda cpu, retry=False: state.Finding("incompatible", "test"))
    assert dict(doctor.report())["nvcc"] == words
    assert f"; nvcc {words}; C++: " in doctor.version_text()


def test_doctor_runs_as_a_command_without_compiling(tmp_path):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "apexlite", "doctor"], capture_output=True, text=True, env=env,
                          check=True)
    assert "CPU kernel" in done.stdout and "import apex" in done.stdout
    assert "compiling" not in done.stdout + done.stderr and not list(tmp_path.rglob("*.so"))
