"""A child `python -I -S` that sees only a script's folder and torch's site-packages: torch alone, no apex and
no apexlite (the child asserts both are unimportable). What a migrated script must run on."""
import subprocess
import sys
from pathlib import Path
from typing import List

import torch

TORCH_SITE = str(Path(torch.__file__).resolve().parents[1])
ISOLATED = """
import importlib.util, os, runpy, sys
script, site = sys.argv[1], sys.argv[2]
sys.path[:] = [os.path.dirname(script), *sys.path, site]  # -I -S: the standard library only, until now
assert importlib.util.find_spec("apexlite") is None, "apexlite is importable"
assert importlib.util.find_spec("apex") is None, "apex is importable"
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def isolated_command(script: Path, *args: str) -> List[str]:
    """The command line that runs `script` with `args` on torch alone."""
    return [sys.executable, "-I", "-S", "-c", ISOLATED, str(script), TORCH_SITE, *args]


def run_isolated(script: Path, *args: str, timeout: float, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(isolated_command(script, *args), capture_output=True, text=True, timeout=timeout, env=env)
