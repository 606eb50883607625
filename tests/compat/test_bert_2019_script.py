"""A 2019 BERT fine-tuning script (apex.optimizers.FP16_Optimizer + FusedAdam, model.half(),
optimizer.backward) runs unchanged under `python -m apexlite run` and trains like its fp32 path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "compat" / "_scripts" / "bert_2019_finetune.py"

pytestmark = pytest.mark.slow


def _losses(*command):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env["OMP_NUM_THREADS"] = "1"  # a tiny model: threads only contend on a shared machine
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fp32_losses():
    return _losses(str(SCRIPT))["losses"]  # plain python: the fp32 path never imports apex


def _mean(values):
    return sum(values) / len(values)


def test_static_loss_scale_run_trains_like_fp32(fp32_losses):
    run = _losses("-m", "apexlite", "run", str(SCRIPT), "--fp16", "--loss_scale", "128")
    losses = run["losses"]
    assert run["loss_scale"] == 128.0
    assert _mean(losses[-10:]) < 0.5 * _mean(losses[:10])  # it learns
    # step by step while fp16 rounding has not compounded yet, then the trained state as a whole
    for step, (half, full) in enumerate(zip(losses[:20], fp32_losses)):
        assert abs(half - full) <= 0.02 + 0.02 * abs(full), (step, half, full)
    assert abs(_mean(losses[-10:]) - _mean(fp32_losses[-10:])) < 0.02


def test_dynamic_loss_scale_run_trains_like_fp32(fp32_losses):
    run = _losses("-m", "apexlite", "run", str(SCRIPT), "--fp16")
    losses = run["losses"]
    assert run["loss_scale"] <= 2.0 ** 16  # apex's 2019 dynamic scale: starts at 2**16, halves on overflow
    assert _mean(losses[-10:]) < 0.5 * _mean(losses[:10])
    assert abs(_mean(losses[-10:]) - _mean(fp32_losses[-10:])) < 0.03
