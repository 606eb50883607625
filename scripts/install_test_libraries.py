"""Install the real libraries the tests run apex paths of (pyproject's `test-libraries` extra) for one Python.

They go into their own venv, build/test-libraries/<hash of the test interpreter's sys.prefix>, which
sees the test interpreter's packages (torch, apexlite) through a .pth, so the test venv itself stays
as CI makes it (without these libraries and their dependencies). Pins of the extra are installed as written; those named in NO_DEPS are
installed without their dependencies (timm's torchvision: PyPI's wheel for torch 2.13 is CUDA-linked
and cannot load with the CPU torch, and the tests need only timm's fast_norm.py). torch is pinned to
the version the test interpreter has, so pip never replaces it.

Usage: python scripts/install_test_libraries.py            (installs, unless already up to date)
       python scripts/install_test_libraries.py --versions (what is installed there, as JSON)
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
EXTRA = "test-libraries"
NO_DEPS = {"timm"}


def libraries_dir(prefix: str = sys.prefix) -> Path:
    """Where the libraries venv of the interpreter with `prefix` lives (tests/libraries/_libs.py agrees)."""
    return ROOT / "build" / "test-libraries" / hashlib.sha256(prefix.encode()).hexdigest()[:16]


def pinned_requirements() -> List[str]:
    """The `test-libraries` extra of pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the extra is one line of quoted pins
        match = re.search(rf'^{re.escape(EXTRA)}\s*=\s*\[(.*?)\]', text, re.M | re.S)
        return re.findall(r'"([^"]+)"', match.group(1)) if match else []
    return list(tomllib.loads(text)["project"]["optional-dependencies"][EXTRA])


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def installed_versions(python: Path) -> Optional[Dict[str, Optional[str]]]:
    """{package: version or None} in the libraries venv, or None when there is no such venv."""
    if not python.exists():
        return None
    names = [_name(requirement) for requirement in pinned_requirements()]
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else None


def create(target: Path) -> Path:
    """The venv (created if missing) with the .pth that lets it see this interpreter's packages."""
    python = target / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "apexlite_test_base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def install(python: Path) -> None:
    requirements = pinned_requirements()
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    no_deps = [r for r in requirements if _name(r) in NO_DEPS]
    with_deps = [r for r in requirements if _name(r) not in NO_DEPS]
    torch = f"torch=={importlib.metadata.version('torch')}"
    if with_deps:
        subprocess.run(pip + [torch, *with_deps], check=True)
    if no_deps:  # last, so pip's check of the others does not report their missing dependencies
        subprocess.run(pip + ["--no-deps", *no_deps], check=True)


def up_to_date(python: Path) -> bool:
    """Every pin of the extra installed at its pinned version in the libraries venv."""
    versions = installed_versions(python) or {}
    pins = {_name(r): r.split("==", 1)[1] for r in pinned_requirements() if "==" in r}
    return bool(pins) and all(versions.get(name) == version for name, version in pins.items())


def main(argv: List[str]) -> int:
    target = libraries_dir()
    python = target / "bin" / "python"
    if argv == ["--versions"]:
        print(json.dumps(installed_versions(python), sort_keys=True))
        return 0
    if up_to_date(python):
        print(f"test libraries: up to date in {target}", file=sys.stderr)
        return 0
    started = time.perf_counter()
    install(create(target))
    print(f"test libraries: installed {' '.join(pinned_requirements())} into {target} "
          f"in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
