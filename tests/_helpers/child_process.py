"""Runs Python in a child process on a chosen O1 cast path, so a crash or a process-wide cache fails or
isolates one test instead of the whole run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_on_cast_path(path: str, args: List[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """`python *args` from the repository root with sessions on the `path` ("native"/"python") cast path;
    skips when the native path is asked for and unavailable, fails unless the child exits with 0."""
    from apexlite.amp.o1 import native_casts

    if path == "native" and not native_casts.use_native():
        pytest.skip(f"native O1 casts unavailable: {native_casts.status()}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env[native_casts.DISABLE_ENV] = "1" if path == "python" else "0"
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"child exited with {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def process_alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not count); reads /proc, so Linux only."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
