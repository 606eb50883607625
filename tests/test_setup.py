"""setup.py: an editable install whose compile fails still installs, says so in one line with the compiler's
first error, removes an earlier build's library, and records the failure, which doctor then reports
without compiling again; with APEXLITE_REQUIRE_EXTENSION=1 the same failure fails the install.

The compiler is a shim that fails every compile (and passes version queries to the real one), so no
real compile runs; pip's own work still takes a few seconds, so these are marked slow.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from tests._helpers.user_env import QUIET_TORCH, user_environment
from tests.test_packaging import NOT_SHIPPED

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler for version queries")]
ROOT = Path(__file__).resolve().parents[1]
FAILING_COMPILER = """#!/bin/sh
# Fails every compile the way a compiler does; anything else (version queries) goes to the real one.
for arg in "$@"; do
    case "$arg" in *.cpp|*.cu) source=$arg ;; esac
done
if [ -n "${source:-}" ]; then
    echo "$source:1:1: error: simulated compile error" >&2
    exit 1
fi
exec REAL "$@"
"""


@pytest.fixture
def editable_install(tmp_path):
    """Runs `pip install -v --no-build-isolation -e <copy of the checkout>` into a fresh venv that sees this
    interpreter's packages (torch, setuptools), with the failing compiler; returns (copy, run)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SHIPPED)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "base.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    compiler = tmp_path / "bin" / "c++"
    compiler.parent.mkdir()
    compiler.write_text(FAILING_COMPILER.replace("REAL", shutil.which("c++")))
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    env = user_environment(CXX=str(compiler), PATH=f"{compiler.parent}{os.pathsep}{os.environ['PATH']}",
                           TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"), PYTHONWARNINGS=QUIET_TORCH)

    def run(*args, **extra_env):
        return subprocess.run([str(python), *args], cwd=checkout, env=dict(env, **extra_env), capture_output=True,
                              text=True, timeout=1800)

    return checkout, run


def _apexlite_lines(output: str):
    return [line.strip() for line in output.splitlines() if line.strip().startswith("apexlite: ")]


def test_a_compile_error_still_installs_and_is_said_once(editable_install):
    checkout, run = editable_install
    stale = checkout / "apexlite" / f"_C.{sysconfig.get_config_var('SOABI')}.so"
    stale.write_bytes(b"an earlier build, for another torch")
    done = run("-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", "-e", ".")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = _apexlite_lines(done.stdout + done.stderr)
    failed = [line for line in lines if "failed" in line]
    assert len(failed) == 1, lines
    assert re.match(rf"apexlite: compiling apexlite\._C \(CPU kernel, O1 casts\) against torch {re.escape(torch.__version__)}"
                    r" failed after \d+ s: csrc/torch/\w+\.cpp:1:1: error: simulated compile error$", failed[0])
    assert lines[0].startswith("apexlite: compiling apexlite._C (CPU kernel, O1 casts)") and "about" in lines[0]
    assert not list((checkout / "apexlite").glob("_C*.so"))
    record = json.loads((checkout / "apexlite" / "_build_record.json").read_text())
    assert record["torch"] == torch.__version__ and record["cpu"]["state"] == "failed"
    assert "simulated compile error" in record["cpu"]["detail"]

    report = run("-m", "apexlite", "doctor")
    assert report.returncode == 0, report.stderr
    row = next(line for line in report.stdout.splitlines() if line.startswith("CPU kernel"))
    assert f"failed: compiling them against torch {torch.__version__} failed at install: csrc/torch/" in row
    assert "python -m apexlite doctor --build" in row and "compiling apexlite" not in report.stderr


def test_require_extension_turns_the_failure_into_an_install_error(editable_install):
    _, run = editable_install
    done = run("-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", ".", APEXLITE_REQUIRE_EXTENSION="1")
    assert done.returncode != 0 and "simulated compile error" in done.stdout + done.stderr


def test_without_a_compiler_nothing_is_tried_and_it_is_said_once(tmp_path):
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SHIPPED)
    env = user_environment(CXX=str(tmp_path / "no-such-compiler"), PYTHONWARNINGS=QUIET_TORCH)
    done = subprocess.run([sys.executable, "setup.py", "build_py", "--build-lib", str(tmp_path / "lib"), "build_ext"],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _apexlite_lines(done.stdout + done.stderr) == [
        "apexlite: no kernels compiled at install: no C++ compiler found (install g++ or set CXX). FusedAdam and O1 "
        "use torch's ops until that is fixed; then they are compiled on first use (or with `python -m apexlite "
        "doctor --build`)."]
    record = json.loads((tmp_path / "lib" / "apexlite" / "_build_record.json").read_text())
    assert record["cpu"] == {"state": "not built", "detail": "no C++ compiler found (install g++ or set CXX)"}
    assert (tmp_path / "lib" / "apexlite" / "_csrc" / "torch" / "ops.cpp").is_file()
