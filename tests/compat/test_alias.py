"""`python -m apexlite alias install|uninstall|status`, in a fresh virtual environment.

The venv is made with `python -m venv --without-pip` (no network, under a second); it sees torch and
apexlite through a .pth that adds this interpreter's site-packages as a site dir (editable apexlite
included), so what the alias writes lands in the fresh venv's own site-packages, apart from ours.
"""
import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from apexlite.compat import alias
from apexlite.compat.child_path.sitecustomize import LEGACY_TOP_LEVEL
from tests.compat.test_extension_modules import check_megatron_report

TIMEOUT_S = 180
MEGATRON_KERNELS = Path(__file__).parent / "_scripts" / "megatron_fused_kernels.py"
COMPAT = "apexlite.compat.apex"
BASE_PTH = "apexlite_test_base.pth"

RESOLVE = textwrap.dedent("""
    import importlib.metadata, multiprocessing, subprocess, sys
    import apex, amp_C
    from apex.normalization.fused_layer_norm import FusedLayerNorm


    def child(queue):
        import apex
        queue.put(apex.__name__)


    if __name__ == "__main__":
        dist = importlib.metadata.distribution("apex")
        print(apex.__name__, amp_C.__name__, FusedLayerNorm.__module__, dist.version,
              dist.read_text("top_level.txt").split(), dist.read_text("INSTALLER").strip())
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        print("spawn", queue.get(timeout=120))
        process.join()
        done = subprocess.run([sys.executable, "-c", "import apex; print(apex.__name__)"], capture_output=True,
                              text=True)
        print("subprocess", done.stdout.strip() or done.stderr.strip())
""")


@pytest.fixture
def venv(tmp_path):
    """(python, site-packages) of a fresh venv that sees this interpreter's packages but has no apex."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=TIMEOUT_S)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / BASE_PTH).write_text(f"import site; site.addsitedir({ours!r})\n")
    return python, site


def _env():
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    env.pop("PYTHONPATH", None)
    return env


def _alias(python, action, cwd):
    return subprocess.run([str(python), "-m", "apexlite", "alias", action], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=_env())


def _tree(site):
    """Every file under site-packages with its content hash: what an uninstall must leave as it found."""
    return {str(path.relative_to(site)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(site.rglob("*")) if path.is_file()} | {
        str(path.relative_to(site)) + "/": "dir" for path in sorted(site.rglob("*")) if path.is_dir()}


@pytest.mark.slow
def test_alias_install_resolves_everywhere_then_uninstall_leaves_the_venv_as_found(venv, tmp_path):
    python, site = venv
    before = _tree(site)
    status = _alias(python, "status", tmp_path)
    assert status.returncode == 1 and "no apexlite alias" in status.stderr

    installed = _alias(python, "install", tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert "apexlite alias installed" in installed.stdout
    script = tmp_path / "uses_apex.py"
    script.write_text(RESOLVE)
    result = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=TIMEOUT_S,
                            cwd=tmp_path, env=_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{COMPAT} apexlite.compat.amp_C apexlite.normalization.modules 0.1+apexlite {list(LEGACY_TOP_LEVEL)} "
        "apexlite",
        f"spawn {COMPAT}",
        f"subprocess {COMPAT}",
    ]
    status = _alias(python, "status", tmp_path)
    assert status.returncode == 0 and "`import apex` resolves to apexlite" in status.stdout, status.stderr
    megatron = subprocess.run([str(python), str(MEGATRON_KERNELS)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=tmp_path, env=_env())  # imports by name, importlib included
    assert megatron.returncode == 0, megatron.stderr
    check_megatron_report(json.loads(megatron.stdout.strip().splitlines()[-1]))
    again = _alias(python, "install", tmp_path)
    assert again.returncode == 0 and "already installed" in again.stdout

    removed = _alias(python, "uninstall", tmp_path)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stderr
    assert _tree(site) == before  # the stand-ins' __pycache__ included
    plain = subprocess.run([str(python), "-c", "import apex"], capture_output=True, text=True, cwd=tmp_path,
                           env=_env(), timeout=TIMEOUT_S)
    assert plain.returncode != 0 and "No module named 'apex'" in plain.stderr
    assert _alias(python, "uninstall", tmp_path).returncode == 0  # nothing left to remove: still fine


@pytest.mark.parametrize("real_apex", {
    "package": {"apex/__init__.py": "REAL = True\n"},
    "extension": {"amp_C" + importlib.machinery.EXTENSION_SUFFIXES[0]: ""},
    "distribution": {"apex-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: apex\nVersion: 0.1\n"},
}.items(), ids=lambda item: item[0])
def test_alias_refuses_where_a_real_apex_is_installed(venv, tmp_path, real_apex):
    python, site = venv
    for path, text in real_apex[1].items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    before = _tree(site)
    refused = _alias(python, "install", tmp_path)
    assert refused.returncode == 1
    assert "refused, a real apex is installed" in refused.stderr and "pip uninstall apex" in refused.stderr
    assert _tree(site) == before


def test_alias_uninstall_keeps_a_file_changed_since_install(venv, tmp_path):
    python, site = venv
    assert _alias(python, "install", tmp_path).returncode == 0
    stand_in = site / "apex" / "__init__.py"
    stand_in.write_text(stand_in.read_text() + "# edited by hand\n")
    status = _alias(python, "status", tmp_path)
    assert status.returncode == 1 and "apex/__init__.py: modified" in status.stderr
    removed = _alias(python, "uninstall", tmp_path)
    assert removed.returncode == 1 and "kept apex/__init__.py" in removed.stderr
    assert stand_in.exists() and not (site / "amp_C").exists()
    assert sorted(path.name for path in site.iterdir()) == sorted([BASE_PTH, "apex", "apex-0.1+apexlite.dist-info"])


def test_alias_usage():
    result = subprocess.run([sys.executable, "-m", "apexlite", "alias"], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=_env())
    assert result.returncode == 2 and "install|uninstall|status" in result.stderr


def test_an_alias_from_an_older_apexlite_is_reported_and_replaced_by_install(tmp_path, monkeypatch):
    """An alias written when apexlite provided fewer top-level modules: status says so, install rewrites it,
    uninstall then leaves the directory as found."""
    site = tmp_path / "site-packages"
    site.mkdir()
    with monkeypatch.context() as older:
        older.setattr(alias, "LEGACY_TOP_LEVEL", ("apex", "amp_C"))
        assert alias.install(site)[0] == 0
    assert not (site / "fused_layer_norm_cuda").exists()
    code, report = alias.status(site)
    assert code == 1 and "out of date" in report and "fused_layer_norm_cuda/__init__.py" in report
    code, message = alias.install(site)
    assert code == 0 and "installed" in message
    assert all((site / name / "__init__.py").is_file() for name in LEGACY_TOP_LEVEL)
    assert alias.status(site)[0] == 0
    assert alias.uninstall(site)[0] == 0
    assert list(site.iterdir()) == []


def test_install_after_an_uninstall_that_kept_a_changed_file_the_user_then_deleted(tmp_path, monkeypatch):
    """uninstall keeps a hand-edited stand-in and the alias's record, and says so; once the user deletes the
    file, install takes the record for its own leftover (not for a real apex) and writes the alias anew."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])  # where real_apex looks: this site is the env's
    assert alias.install(site)[0] == 0
    stand_in = site / "apex" / "__init__.py"
    stand_in.write_text(stand_in.read_text() + "# edited by hand\n")
    code, message = alias.uninstall(site)
    assert code == 1 and "kept apex/__init__.py" in message and "alias uninstall` runs again" in message
    stand_in.unlink()
    code, message = alias.install(site)
    assert code == 0 and "installed" in message, message
    assert alias.status(site)[0] == 0
    assert alias.uninstall(site)[0] == 0
    assert list(site.iterdir()) == []
