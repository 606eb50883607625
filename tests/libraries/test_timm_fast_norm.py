"""timm's fast_norm takes its apex path under apexlite, unchanged, and gets torch's results.

timm.layers.fast_norm detects apex with `from apex.normalization.fused_layer_norm import
fused_layer_norm_affine` (has_apex) and `... import fused_rms_norm_affine, fused_rms_norm`
(has_apex_rmsnorm), then calls them. The file is loaded from the installed timm by its path: importing
the timm package needs torchvision, whose PyPI wheel for this torch is CUDA-linked and cannot load with
a CPU torch; fast_norm.py itself imports only torch (and apex). It runs through each way in: `apexlite
run`, `apexlite.install()` at the top of the script, and the environment alias in a fresh venv.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.libraries._libs import clean_env, python_with_file, run_python

FAST_NORM = "layers/fast_norm.py"
SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    {prologue}
    import torch
    import torch.nn.functional as F

    spec = importlib.util.spec_from_file_location("timm_fast_norm", sys.argv[1])
    fast_norm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fast_norm)
    import apex.normalization.fused_layer_norm as apex_fln

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8, 16) * 3 + 1, torch.randn(16), torch.randn(16)
    layer = fast_norm.fast_layer_norm(x, [16], w, b, 1e-5)
    rms = fast_norm.fast_rms_norm(x, [16], w, 1e-5)
    rms_plain = fast_norm.fast_rms_norm(x, [16], None, 1e-5)
    rms_reference = x.double() * torch.rsqrt(x.double().square().mean(-1, keepdim=True) + 1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = fast_norm.fast_layer_norm(x, [16], w, b, 1e-5)
    low_reference = F.layer_norm(x.bfloat16().float(), [16], w.bfloat16().float(), b.bfloat16().float(), 1e-5)
    print(json.dumps({{
        "has_apex": fast_norm.has_apex, "has_apex_rmsnorm": fast_norm.has_apex_rmsnorm,
        "same_function": fast_norm.fused_layer_norm_affine is apex_fln.fused_layer_norm_affine,
        "apex_module": apex_fln.__name__,
        "layer_norm_error": (layer - F.layer_norm(x, [16], w, b, 1e-5)).abs().max().item(),
        "rms_norm_error": (rms.double() - rms_reference * w.double()).abs().max().item(),
        "rms_plain_error": (rms_plain.double() - rms_reference).abs().max().item(),
        "autocast_dtype": str(low.dtype),
        "autocast_error": (low.float() - low_reference.bfloat16().float()).abs().max().item(),
    }}))
""")
WAYS_IN = {
    "run": ("", ["-m", "apexlite", "run"]),
    "install": ("import apexlite; apexlite.install()", []),
}


def _fast_norm_path(python):
    return subprocess.run([python, "-c", "import importlib.util, os; "
                           "print(os.path.join(os.path.dirname(importlib.util.find_spec('timm').origin), "
                           f"{FAST_NORM!r}))"], capture_output=True, text=True, check=True,
                          env=clean_env()).stdout.strip()


def _check(report):
    assert report["has_apex"] is True and report["has_apex_rmsnorm"] is True
    assert report["same_function"] is True
    assert report["apex_module"] == "apexlite.compat.apex.normalization.fused_layer_norm"
    assert report["layer_norm_error"] < 1e-5
    assert report["rms_norm_error"] < 1e-5 and report["rms_plain_error"] < 1e-5
    # apex's functions under autocast: inputs cast to bf16, fp32 statistics, bf16 out (timm relies on this)
    assert report["autocast_dtype"] == "torch.bfloat16" and report["autocast_error"] <= 2 ** -7 * 4


@pytest.mark.parametrize("way_in", sorted(WAYS_IN))
def test_timm_fast_norm_takes_the_apex_path(tmp_path, way_in):
    python = python_with_file("timm", FAST_NORM)
    prologue, launcher = WAYS_IN[way_in]
    script = tmp_path / "timm_fast_norm_check.py"
    script.write_text(SCRIPT.format(prologue=prologue))
    done = run_python(python, [*launcher, str(script), _fast_norm_path(python)], tmp_path)
    _check(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_timm_fast_norm_through_the_environment_alias(tmp_path):
    """A fresh venv layered on the libraries' one, with `apexlite alias install`: plain `python script`."""
    base = python_with_file("timm", FAST_NORM)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    base_site = subprocess.run([base, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "apexlite_test_base.pth").write_text(f"import site; site.addsitedir({base_site!r})\n")
    run_python(python, ["-m", "apexlite", "alias", "install"], tmp_path)
    script = tmp_path / "timm_fast_norm_check.py"
    script.write_text(SCRIPT.format(prologue=""))
    done = run_python(python, [str(script), _fast_norm_path(python)], tmp_path)
    _check(json.loads(done.stdout.strip().splitlines()[-1]))
