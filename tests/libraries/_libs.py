"""Running a real library's apex path in a fresh interpreter that has the library.

The libraries (pyproject's `test-libraries` extra) live in a venv of their own beside the test venv,
build/test-libraries/<hash of the test interpreter's sys.prefix> (scripts/install_test_libraries.py
makes it and agrees on the place); it sees the test venv's torch and apexlite. A library installed in
the test interpreter itself is used too. A test skips, saying so, only when no such interpreter can
import the library.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600
INSTALL_HINT = ("scripts/setup.sh installs it (scripts/install_test_libraries.py, unless "
                "APEXLITE_SKIP_TEST_LIBRARIES=1)")


def libraries_python() -> Path:
    """The python of the libraries venv that belongs to this test interpreter."""
    digest = hashlib.sha256(sys.prefix.encode()).hexdigest()[:16]
    return ROOT / "build" / "test-libraries" / digest / "bin" / "python"


def python_with(*modules: str) -> str:
    """An interpreter that can import every one of `modules` (this one, else the libraries venv's); skips
    the test with the import error when there is none."""
    return _python_passing("import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)",
                           list(modules))


def python_with_file(package: str, relative: str) -> str:
    """An interpreter in which `package` is installed with the file `relative` in it (found, not imported)."""
    check = ("import importlib.util, os, sys\nspec = importlib.util.find_spec(sys.argv[1])\n"
             "if spec is None:\n    raise ModuleNotFoundError(f\"No module named '{sys.argv[1]}'\")\n"
             "path = os.path.join(os.path.dirname(spec.origin), sys.argv[2])\n"
             "assert os.path.exists(path), f'{path} is missing'\nprint(path)")
    return _python_passing(check, [package, relative])


def _python_passing(check: str, args: List[str]) -> str:
    errors = []
    for python in (Path(sys.executable), libraries_python()):
        if not python.exists():
            errors.append(f"{python}: no such interpreter")
            continue
        done = subprocess.run([str(python), "-c", check, *args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=clean_env())
        if done.returncode == 0:
            return str(python)
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        if not last.startswith("ModuleNotFoundError") or not any(f"'{arg.split('.')[0]}'" in last for arg in args):
            raise AssertionError(f"{python} has {args[0]} but the check failed:\n{done.stderr}")
        errors.append(f"{python}: {last}")
    pytest.skip(f"{args[0]} cannot be imported ({'; '.join(errors)}); {INSTALL_HINT}")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment without apexlite's variables or PYTHONPATH, offline for Hugging Face libraries."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("APEXLITE_") and key != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


def run_python(python: str, args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run `python ARGS...` in `cwd`; fails the test with its output when it exits non-zero."""
    done = subprocess.run([python, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          env=clean_env())
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done
