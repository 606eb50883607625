"""scripts/setup.sh's main profile (scripts/requirements-main.txt) covers what the README's commands import.

Each command runs in this environment (which setup.sh made: the main profile plus the test tools) as a
user's shell would, with an import recorder: nothing on its stderr may look like a failure (torch's
"Failed to initialize NumPy" warning, a missing module), and every distribution it imported must be
in the main profile or required by one of its packages, so that `bash scripts/run_main.sh` alone makes
an environment in which these commands run cleanly. Each command starts torch in a fresh process, so
these are marked slow.
"""
from __future__ import annotations

import importlib.metadata as metadata
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Set

import pytest

from tests._helpers.user_env import user_environment

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "scripts" / "requirements-main.txt"
RECORDER = """
import atexit, json, runpy, sys
record = sys.argv.pop(1)
atexit.register(lambda: open(record, "w").write(json.dumps(sorted({name.split(".")[0] for name in sys.modules}))))
sys.argv[0] = "apexlite"
runpy.run_module("apexlite", run_name="__main__", alter_sys=True)
"""
# The README's commands (id, arguments of `python -m apexlite`, exit statuses the README gives them)
README_COMMANDS = [
    ("version", ["--version"], {0}),
    ("doctor", ["doctor"], {0}),
    ("check", ["check", "examples/imagenet_amp.py"], {0}),
    ("migrate", ["migrate", "examples/long_training_amp.py", "--diff"], {0, 1}),  # 1: TODOs left for the user
    ("run", ["run", "examples/imagenet_amp.py", "--opt-level", "O1", "--epochs", "1", "--steps-per-epoch", "2"], {0}),
]
FAILURE_WORDS = re.compile(r"Warning|Failed|Error|No module named")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line ('numpy==2.4.6  # why' -> 'numpy')."""
    return re.split(r"[<>=!~;\[ (]", requirement.split("#")[0].strip())[0].lower().replace("_", "-")


def main_profile() -> Set[str]:
    return {_name(line) for line in MAIN.read_text().splitlines() if _name(line)}


def with_dependencies(names: Set[str]) -> Set[str]:
    """`names` and everything their installed metadata requires (extras left out), transitively."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(req) for req in requires if "extra ==" not in req and "extra==" not in req]
    return found


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def imported_distributions(modules: Set[str]) -> Set[str]:
    owners = metadata.packages_distributions()
    return {_name(dist) for module in modules for dist in owners.get(module, [])} - {"apexlite"}


def test_the_main_profile_names_numpy_and_libcst():
    assert {"torch", "wrapt", "ninja", "numpy", "libcst"} <= main_profile()


@pytest.mark.parametrize("args, statuses", [c[1:] for c in README_COMMANDS], ids=[c[0] for c in README_COMMANDS])
def test_a_readme_command_imports_only_the_main_profile_and_warns_nothing(tmp_path, args, statuses):
    absent = sorted(name for name in main_profile() if not _installed(name))
    if absent:  # e.g. CI's torch-floor venv, made by hand: what it prints says nothing about setup.sh's
        pytest.skip(f"this environment was not made by scripts/setup.sh: {', '.join(absent)} not installed")
    record = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", RECORDER, str(record), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=user_environment(TORCH_EXTENSIONS_DIR=str(tmp_path / "ext")))
    assert done.returncode in statuses, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if FAILURE_WORDS.search(line)], done.stderr[-3000:]
    imported = imported_distributions(set(json.loads(record.read_text())))
    assert "torch" in imported
    missing = imported - with_dependencies(main_profile())
    assert not missing, f"{args} imports {sorted(missing)}, which scripts/requirements-main.txt does not install"
