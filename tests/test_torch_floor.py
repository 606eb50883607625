"""The torch floor: one number in apexlite/torch_floor.py and pyproject.toml, and a clear warning below it."""
import os
import re
import subprocess
import sys

import pytest

from apexlite import torch_floor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pyproject_requires_the_same_floor():
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        requirement = re.search(r'"torch>=([0-9.]+)"', handle.read())
    assert requirement is not None, "pyproject.toml's dependencies name no torch floor"
    assert torch_floor.parse(requirement.group(1)) == torch_floor.MIN_TORCH


def test_ci_runs_the_floor():
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as handle:
        pinned = re.search(r"^FLOOR_TORCH=([0-9.]+)", handle.read(), re.MULTILINE)
    assert pinned is not None, ".ci/run pins no FLOOR_TORCH"
    assert torch_floor.parse(pinned.group(1)) == torch_floor.MIN_TORCH


@pytest.mark.parametrize("version", ["2.5.1+cu124", "2.13.0+cpu", "2.14.1+cu130", "2.10.0a0+git1234", "3.0.0"])
def test_supported_versions_get_no_message(version):
    assert torch_floor.unsupported_message(version) is None


@pytest.mark.parametrize("version", ["2.1.2+cu121", "2.4.1", "1.13.1"])
def test_older_versions_are_told_the_floor_and_the_fix(version):
    message = torch_floor.unsupported_message(version)
    assert f"this is torch {version}" in message and "torch >= 2.5" in message
    assert "pip install 'torch>=2.5'" in message and "docs/compatibility.md" in message


def test_a_version_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="not a torch version"):
        torch_floor.parse("nightly")


@pytest.mark.parametrize("version,warned", [("2.1.2+cu121", True), ("2.13.0+cpu", False)])
def test_importing_apexlite_warns_below_the_floor(version, warned):
    code = ("import warnings, torch\n"
            f"torch.__version__ = {version!r}\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import apexlite\n"
            "print(sum('apexlite supports torch' in str(w.message) for w in caught))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("1" if warned else "0")
