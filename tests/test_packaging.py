"""A plain `pip install <checkout>` in a fresh venv, as installing from an index does (pip's build isolation:
no torch in the build, so nothing is compiled at install): the kernel sources travel in the wheel, the first
FusedAdam step compiles them once (a line before, the steps done while it runs, a line after; its time is
kept for the next estimate), the step then runs apexlite's compiled kernel, O1 gets the native casts,
doctor calls the library JIT-cached, and nothing printed says "failed".

One fresh venv (torch 2.13.0 from the local wheel, through pip's cache) and one real compile into a
temporary TORCH_EXTENSIONS_DIR: minutes, so it is marked slow.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from apexlite._native import build_plan
from tests._helpers.user_env import QUIET_TORCH, user_environment

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
NOT_SHIPPED = shutil.ignore_patterns(".git", "build", "dist", ".venv*", "*.egg-info", "__pycache__", "*.so", "*.o",
                                     "_build_record.json", "_csrc", ".pytest_cache", "out", "gpu_check_results")
FIRST_STEP = """
import torch
from apexlite import amp
from apexlite._native import loader
from apexlite.amp.o1 import native_casts
from apexlite.optimizers import FusedAdam, _adam_step

torch.manual_seed(0)
p = torch.nn.Parameter(torch.randn(1000))
q = torch.nn.Parameter(p.detach().clone())
optimizer, reference = FusedAdam([p], lr=0.01), torch.optim.AdamW([q], lr=0.01, weight_decay=0.0)
for _ in range(3):
    p.grad = torch.randn(1000)
    q.grad = p.grad.clone()
    optimizer.step()
    reference.step()
torch.testing.assert_close(p.detach(), q.detach())
model = amp.initialize(torch.nn.Linear(4, 4), opt_level="O1", dtype=torch.bfloat16, verbosity=0)
print("RESULT", loader.status().source, _adam_step.resolve("auto", p.device), native_casts.status(),
      torch._C._dispatch_has_kernel_for_dispatch_key("apexlite::fused_adam_", "CPU"))
amp.deinitialize()
"""


USER_ENV = user_environment()


def _run(command, **kwargs):
    kwargs.setdefault("env", USER_ENV)
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, **kwargs)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_plain_pip_install_compiles_the_kernels_on_first_use(tmp_path):
    checkout = tmp_path / "apexlite-checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SHIPPED)
    _run([sys.executable, "-m", "venv", str(tmp_path / "venv")])
    python = str(tmp_path / "venv" / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", f"torch=={torch.__version__.split('+')[0]}"])
    installed = _run([python, "-m", "pip", "install", str(checkout)])
    assert "failed" not in (installed.stdout + installed.stderr).lower()

    package = Path(_run([python, "-c", "import importlib.util as u; print(u.find_spec('apexlite').origin)"],
                        cwd=tmp_path).stdout.strip()).parent
    assert (package / "_csrc" / "torch" / "ops.cpp").is_file() and not list(package.glob("_C*.so"))
    assert json.loads((package / "_build_record.json").read_text())["cpu"]["state"] == "not built"

    env = dict(USER_ENV, TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"), PYTHONWARNINGS=QUIET_TORCH)
    env.pop("MAX_JOBS", None)
    first = _run([python, "-c", FIRST_STEP], cwd=tmp_path, env=env)
    said = first.stdout + first.stderr
    assert first.stdout.split("RESULT", 1)[1].split() == ["jit", "kernel", "native", "True"]
    assert f"apexlite: compiling apexlite's CPU kernels and O1 casts for torch {torch.__version__} (first use, about" \
        in first.stderr
    assert "apexlite: compiled apexlite's CPU kernels and O1 casts in " in first.stderr
    steps = len(build_plan.cpu_sources(ROOT / "csrc")) + 1  # each object file, then the link
    done = re.findall(rf"^apexlite: compiling apexlite's CPU kernels and O1 casts: (\d+) of {steps} steps done after "
                      r"\d+ s", first.stderr, re.M)
    counts = [int(d) for d in done]  # reports every few seconds; on a loaded machine the first may still say 0
    assert counts and counts == sorted(counts) and 0 < counts[-1] < steps and counts[0] >= 0, first.stderr
    assert "failed" not in said.lower()
    [build] = json.loads((tmp_path / "extensions" / "apexlite" / "build_times.json").read_text())
    assert build["library"] == "cpu" and build["cpu_seconds"] > 5 and build["torch"] == torch.__version__

    again = _run([python, "-c", FIRST_STEP], cwd=tmp_path, env=env)  # a later process: cached, quiet
    assert "compil" not in again.stdout + again.stderr
    report = _run([python, "-m", "apexlite", "doctor"], cwd=tmp_path, env=env).stdout
    for row in (r"^CPU kernel +JIT-cached: compiled on first use", r"^O1 casts +native$",
                r"^FusedAdam on CPU +apexlite's compiled kernel$", r"^kernel sources +.*apexlite/_csrc$"):
        assert re.search(row, report, re.M), report
    assert "failed" not in report.lower()
