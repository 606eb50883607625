"""Flag-guarded amp (tests/migrate/scripts/flag_guarded_train.py, the shape of NVIDIA's speech-model
scripts): migrated once, the script trains like the original with the flag on and off.

The original runs under `python -m apexlite run`; the migrated one on torch alone (`python -I -S`, apex
and apexlite unimportable, as in test_examples.py). Flag off, both are plain fp32: the losses are equal.
Flag on, apexlite's O1 against torch.autocast + GradScaler: within migrate --verify's tolerance.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from apexlite.migrate.compare import AGREE, compare
from apexlite.migrate.engine import migrate_source
from apexlite.migrate.options import DEFAULT_TOLERANCE
from tests.migrate.test_examples import ROOT, TIMEOUT_S, run_isolated

SCRIPT = Path(__file__).with_name("scripts") / "flag_guarded_train.py"
STEPS = 6


def _losses(stdout):
    return [float(value) for value in re.findall(r"loss ([\d.]+)", stdout)]


def _run_original(*args):
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    return subprocess.run([sys.executable, "-m", "apexlite", "run", str(SCRIPT), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=TIMEOUT_S, env=env)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    result = migrate_source(SCRIPT.read_bytes())
    assert result.exit_status == 0 and not result.todos and result.remaining == []
    path = tmp_path_factory.mktemp("flag_guarded") / SCRIPT.name
    path.write_bytes(result.migrated)
    return path


def test_the_scaler_and_autocast_take_the_flag(migrated):
    text = migrated.read_text()
    assert 'scaler = torch.amp.GradScaler("cpu", enabled=bool(hparams.fp16_run))' in text
    assert 'torch.autocast(device_type="cpu", dtype=torch.float16, enabled=bool(hparams.fp16_run))' in text
    scaler_line = next(line for line in text.splitlines() if "GradScaler(" in line)
    assert scaler_line.startswith("    scaler"), "the GradScaler is made in train()'s body, on every path"
    assert "loss.backward()" in text and "from apex" not in text


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["0", "1"])
def test_migrated_script_trains_like_the_original(migrated, flag):
    args = ["--fp16-run", flag, "--steps", str(STEPS)]
    original = _run_original(*args)
    assert original.returncode == 0, original.stderr[-3000:]
    ran = run_isolated(migrated, *args)
    assert ran.returncode == 0, ran.stderr[-3000:]
    before, after = _losses(original.stdout), _losses(ran.stdout)
    assert len(before) == STEPS and len(after) == STEPS
    if flag == "0":
        assert after == before, "the fp32 path must be untouched"
    else:
        curve = [[step, loss] for step, loss in enumerate(before)]
        verdict = compare(curve, [[step, loss] for step, loss in enumerate(after)], DEFAULT_TOLERANCE)
        assert verdict.verdict == AGREE, verdict.reason


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["0", "1"])
def test_verify_agrees_with_the_flag_on_and_off(tmp_path, flag):
    """`migrate --verify` itself, both ways: with the flag off the original never calls amp.initialize, so
    it is measured as a script without amp (it used to fail with 'nothing was measured')."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    out = tmp_path / SCRIPT.name
    ran = subprocess.run([sys.executable, "-m", "apexlite", "migrate", str(SCRIPT), "-o", str(out), "--verify",
                          "--max-steps", "4", "--", "--fp16-run", flag, "--steps", str(STEPS)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT_S, env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "verdict: AGREE" in ran.stdout, ran.stdout[-3000:]
