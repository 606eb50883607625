"""Libraries that check for apex find it under `apexlite run`, and only there.

Hugging Face transformers decides `is_apex_available()` with `importlib.util.find_spec("apex")` and
then `importlib.metadata.version("apex")` (a PackageNotFoundError means "not installed"); the probe
below asks exactly that, plus `distribution()`, the distributions listing and a version comparison.
"""
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite.compat import apex_aliases

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90

LIBRARY_PROBE = textwrap.dedent("""
    import importlib.metadata, importlib.util
    from packaging import version

    def is_package_available(name):  # the check transformers' import_utils makes for "apex"
        if importlib.util.find_spec(name) is None:
            return False
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

    dist = importlib.metadata.distribution("apex")
    listed = [d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"] == "apex"]
    print("available", is_package_available("apex"))
    print("version", importlib.metadata.version("apex"), dist.version, dist.metadata["Name"], listed)
    print("at least 0.1", version.parse(importlib.metadata.version("apex")) >= version.parse("0.1"))
""")


def _env(*paths):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    return env


def _python(args, cwd, env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          env=env)


def test_library_apex_check_passes_under_run(tmp_path):
    script = tmp_path / "library_check.py"
    script.write_text(LIBRARY_PROBE)
    result = _python(["-m", "apexlite", "run", str(script)], tmp_path, _env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "available True",
        "version 0.1+apexlite 0.1+apexlite apex ['apex']",
        "at least 0.1 True",
    ]


def test_outside_run_nothing_claims_apex():
    import apexlite.compat.apex  # noqa: F401  (importing apexlite, the runner and the compat tree installs nothing)
    import apexlite.runner  # noqa: F401

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")
    assert not any(d.metadata["Name"] == "apex" for d in importlib.metadata.distributions())


def test_aliases_block_answers_then_forgets():
    with apex_aliases():
        assert importlib.metadata.version("apex") == "0.1+apexlite"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("apex")


def test_an_installed_apex_is_reported_outside_run_and_shadowed_inside(tmp_path):
    site = tmp_path / "site"
    (site / "apex").mkdir(parents=True)
    (site / "apex" / "__init__.py").write_text("")
    info = site / "apex-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n")
    script = tmp_path / "which.py"
    script.write_text("import importlib.metadata\nprint(importlib.metadata.version('apex'))\n")
    outside = _python([str(script)], tmp_path, _env(site))
    inside = _python(["-m", "apexlite", "run", str(script)], tmp_path, _env(site))
    assert outside.stdout.strip() == "0.1", outside.stderr
    assert inside.stdout.strip() == "0.1+apexlite", inside.stderr  # the same answer as `import apex` gives
