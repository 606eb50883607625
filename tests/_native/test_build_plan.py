"""What the install compiles and why not (apexlite/_native/build_plan.py): the decisions from faked machine facts."""
from __future__ import annotations

from pathlib import Path

import pytest

from apexlite._native import build_plan as plan
from apexlite._native import build_time, cpu_share

CSRC = Path(__file__).resolve().parents[2] / "csrc"


def tools(**facts) -> plan.Toolchain:
    """A machine with torch 2.13 CPU, g++, Python headers and ninja, unless `facts` say otherwise."""
    base = dict(torch_version="2.13.0+cpu", torch_cuda=None, cxx="/usr/bin/c++", python_headers=True, ninja=True,
                nvcc=None, nvcc_version=None)
    base.update(facts)
    return plan.Toolchain(**base)


CUDA_121_NVCC_130 = dict(torch_version="2.5.1+cu124", torch_cuda="12.4", nvcc="/usr/local/bin/nvcc",
                         nvcc_version="13.0", cuda_home="/usr/local/cuda")
CUDA_130_NVCC_130 = dict(torch_version="2.14.1+cu130", torch_cuda="13.0", nvcc="/usr/local/bin/nvcc",
                         nvcc_version="13.0", cuda_home="/usr/local/cuda")

# (case id, machine facts, environment) -> (CPU built?, CUDA built?, words in the CPU / CUDA reason)
PLANS = [
    ("build-isolation", dict(torch_version=None), {}, False, False, "not importable by the build", ""),
    ("switched-off", {}, {"APEXLITE_BUILD_EXTENSION": "0"}, False, False, "APEXLITE_BUILD_EXTENSION=0", ""),
    ("no-compiler", dict(cxx=None), {}, False, False, "no C++ compiler", ""),
    ("no-python-headers", dict(python_headers=False), {}, False, False, "python3-dev", ""),
    ("cpu-torch", {}, {}, True, False, "", ""),
    ("cpu-torch-cuda-asked", {}, {"APEXLITE_CUDA": "1"}, True, False, "", "CPU-only build"),
    ("cuda-torch-not-asked", CUDA_130_NVCC_130, {}, True, False, "", "only with APEXLITE_CUDA=1"),
    ("cuda-mismatch", CUDA_121_NVCC_130, {"APEXLITE_CUDA": "1"}, True, False, "",
     "nvcc 13.0 (/usr/local/bin/nvcc) does not match the CUDA 12.4"),
    ("cuda-minor-mismatch", dict(CUDA_130_NVCC_130, torch_cuda="13.1"), {"APEXLITE_CUDA": "1"}, True, True, "", ""),
    ("cuda-match", CUDA_130_NVCC_130, {"APEXLITE_CUDA": "yes"}, True, True, "", ""),
    ("no-nvcc", dict(CUDA_130_NVCC_130, nvcc=None, nvcc_version=None, cuda_home=None), {"APEXLITE_CUDA": "1"}, True,
     False, "", "no CUDA toolkit found"),
    ("nvcc-without-headers", dict(CUDA_130_NVCC_130, cuda_home=None), {"APEXLITE_CUDA": "1"}, True, False, "",
     "no CUDA headers found for /usr/local/bin/nvcc"),
    ("cuda-without-compiler", dict(CUDA_130_NVCC_130, cxx=None), {"APEXLITE_CUDA": "1"}, False, False,
     "no C++ compiler", "no C++ compiler"),
]


@pytest.mark.parametrize("facts, environ, cpu, cuda, cpu_why, cuda_why",
                         [case[1:] for case in PLANS], ids=[case[0] for case in PLANS])
def test_install_plan(facts, environ, cpu, cuda, cpu_why, cuda_why):
    decided = plan.install_plan(tools(**facts), environ)
    assert (decided.cpu.build, decided.cuda.build) == (cpu, cuda)
    assert cpu_why in decided.cpu.why_not and (decided.cpu.why_not == "") == cpu
    assert cuda_why in decided.cuda.why_not


def test_a_mismatch_says_what_to_install():
    reason = plan.cuda_obstacle(tools(**CUDA_121_NVCC_130))
    assert "CUDA 12.x toolkit" in reason and "torch built for CUDA 13" in reason


@pytest.mark.parametrize("value, default, expected", [
    (None, False, False), (None, True, True), ("", True, True), (" 1 ", False, True), ("Yes", False, True),
    ("on", False, True), ("0", True, False), ("false", True, False), ("OFF", True, False), ("no", True, False)])
def test_switch_values(value, default, expected):
    environ = {} if value is None else {"APEXLITE_X": value}
    assert plan.switch_on("APEXLITE_X", default, environ) is expected


@pytest.mark.parametrize("name", ["APEXLITE_DISABLE_EXTENSION", "APEXLITE_BUILD_EXTENSION", "APEXLITE_CUDA",
                                  "APEXLITE_REQUIRE_EXTENSION"])
def test_a_switch_value_that_is_neither_on_nor_off_is_refused(name, monkeypatch):
    monkeypatch.setenv(name, "banana")
    with pytest.raises(ValueError, match=f"{name}='banana' is neither on nor off: set it to 1"):
        if name == plan.DISABLE_ENV:
            plan.extension_disabled()
        else:
            plan.install_plan(tools())


def test_build_switch_off_in_words():
    assert plan.install_plan(tools(), {"APEXLITE_BUILD_EXTENSION": "off"}).cpu.why_not == "APEXLITE_BUILD_EXTENSION=off"


def test_require_is_read_from_the_environment():
    assert plan.install_plan(tools(), {"APEXLITE_REQUIRE_EXTENSION": "1"}).require
    assert not plan.install_plan(tools(), {}).require


def test_first_use_build_also_needs_ninja():
    assert plan.cpu_obstacle(tools(ninja=False)) == ""  # the install runs without ninja, only slower
    assert "ninja" in plan.cpu_obstacle(tools(ninja=False), jit=True)


def test_every_cpp_source_is_in_exactly_one_library():
    cpu = set(plan.cpu_sources(CSRC))
    cuda = set(plan.cuda_sources(CSRC))
    assert cpu.isdisjoint(cuda)
    assert set((CSRC / "torch").glob("*.cpp")) == cpu | {p for p in cuda if p.suffix == ".cpp"}
    assert set((CSRC / "cuda").glob("*.cu")) == {p for p in cuda if p.suffix == ".cu"}
    assert CSRC / "torch" / "ops.cpp" in cpu and all(p.name.endswith("_cuda.cpp") for p in cuda if p.suffix == ".cpp")


def test_source_digest_follows_every_file(tmp_path):
    tree = tmp_path / "csrc"
    (tree / "torch").mkdir(parents=True)
    (tree / "torch" / "ops.cpp").write_text("a")
    (tree / "torch" / "x.h").write_text("b")
    first = plan.source_digest(tree)
    assert plan.source_digest(tree) == first
    (tree / "torch" / "x.h").write_text("c")
    assert plan.source_digest(tree) != first


@pytest.mark.parametrize("log, expected", [
    ("[1/7] c++ -c a.cpp\nFAILED: /tmp/b/o1_cast_table.o\n/x/y/csrc/torch/o1_cast_table.cpp:120:5: error: 'any_modes_set' "
     "is not a member of 'c10::impl::TorchDispatchModeTLS'\nninja: build stopped: subcommand failed.",
     "csrc/torch/o1_cast_table.cpp:120:5: error: 'any_modes_set' is not a member of 'c10::impl::TorchDispatchModeTLS'"),
    ("/site/apexlite/_csrc/torch/ops.cpp:3:10: fatal error: Python.h: No such file or directory",
     "_csrc/torch/ops.cpp:3:10: fatal error: Python.h: No such file or directory"),
    ("Ninja is required to load C++ extensions", "Ninja is required to load C++ extensions"),
    ("", "no output"),
], ids=["compile-error", "missing-header", "no-error-word", "empty"])
def test_first_error_line(log, expected):
    assert plan.first_error_line(log) == expected


def test_parallel_jobs():
    assert plan.parallel_jobs({"MAX_JOBS": "3"}) == 3
    assert plan.parallel_jobs({}) == plan.parallel_jobs({"MAX_JOBS": "0"}) == cpu_share.usable_cores()


def test_first_use_note_gives_this_machines_estimate(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    # 2 jobs on 2 cores beside 2 busy tasks: 1 core
    monkeypatch.setattr(build_time, "this_machine", lambda jobs: cpu_share.Machine(2, jobs, beside=2.0))
    build_time.remember(build_time.history_file(), build_time.PastBuild("cpu", 150.0, 80.0, "2.13.0+cpu",
                                                                        "/usr/bin/c++", 2, 0.0, 2))
    assert "once per torch version (about 2.5 min here, cached)" in plan.first_use_note("cpu", 2, tools())
    assert "(about 2.5 min here, cached)" in plan.first_use_note("cpu", 2)  # no torch (build isolation): any past build


def _toolkit(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "include" / "cuda_runtime_api.h").write_text("")
    return root


def test_cuda_home_is_the_toolkit_behind_a_wrapper_nvcc(tmp_path, monkeypatch):
    wrapper = tmp_path / "wrappers" / "bin"
    wrapper.mkdir(parents=True)
    (wrapper / "nvcc").write_text("#!/bin/sh\nexec /opt/cuda/bin/nvcc \"$@\"\n")
    (wrapper / "nvcc").chmod(0o755)
    assert plan.find_cuda_home({"PATH": str(wrapper)}) in (None, "/usr/local/cuda")  # not the wrapper's folder
    toolkit = _toolkit(tmp_path / "cuda-13.0")
    link = tmp_path / "links" / "bin"
    link.mkdir(parents=True)
    (toolkit / "bin" / "nvcc").chmod(0o755)
    (link / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    assert plan.find_cuda_home({"PATH": str(link)}) == str(toolkit)  # a link is followed to its toolkit
    assert plan.find_cuda_home({"PATH": str(link), "CUDA_HOME": "/mine"}) == "/mine"  # the user's word wins
    assert plan.cuda_include_dirs(str(toolkit))[0] == str(toolkit / "include")


@pytest.mark.parametrize("version,refused", [("76.1.0", True), ("61.0", True), ("77.0.3", False), ("84.2.1", False),
                                             ("80.0.0.post1", False), ("dev", False)])
def test_setuptools_too_old_for_the_spdx_license_is_named(version, refused):
    said = plan.setuptools_obstacle(version)
    assert (said is not None) == refused
    if refused:
        assert "needs setuptools >= 77" in said and version in said and "pip install -U setuptools" in said


def test_pyproject_declares_what_the_check_requires():
    """pip's isolated builds fetch pyproject's build requirement: it must be the same floor."""
    text = (CSRC.parent / "pyproject.toml").read_text()
    assert f'"setuptools>={plan.MIN_SETUPTOOLS}"' in text and 'license = "BSD-3-Clause"' in text
