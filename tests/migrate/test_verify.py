"""`migrate --verify`: the curve comparison, the child that runs migrated scripts (loss capture, step budget,
apex refused), and that a broken migration is caught."""
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from apexlite.migrate import scaling
from apexlite.migrate.compare import AGREE, DIFFER, INCOMPLETE, compare, relative_difference
from apexlite.migrate.engine import migrate_source
from apexlite.migrate.options import MigrateOptions
from apexlite.migrate.verify import CHILD, verify_migration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.mark.parametrize("original,migrated,expected", [
    (2.0, 2.1, 0.05), (2.0, 2.0, 0.0), (-4.0, -3.0, 0.25), (0.0, 0.5, 0.5), (None, None, 0.0), (1.0, None, math.inf),
])
def test_relative_difference(original, migrated, expected):
    assert relative_difference(original, migrated) == pytest.approx(expected)


def curve(*losses, steps=None):
    return [[step, loss] for step, loss in zip(steps or range(1, len(losses) + 1), losses)]


def test_compare_agrees_within_the_tolerance_and_names_the_worst_point():
    result = compare(curve(4.0, 2.0, 1.0), curve(4.0, 2.02, 1.005), tolerance=0.05)
    assert result.verdict == AGREE and result.at_index == 1 and result.largest == pytest.approx(0.01)


def test_compare_differs_beyond_the_tolerance():
    result = compare(curve(4.0, 2.0, 1.0), curve(4.0, 2.0, 1.2), tolerance=0.05)
    assert result.verdict == DIFFER and "20.000%" in result.reason and result.at_step == 3


def test_compare_differs_when_the_loops_differ():
    assert compare(curve(1.0, 1.0), curve(1.0, 1.0, 1.0), 0.05).verdict == DIFFER
    stepped = compare(curve(1.0, 1.0, steps=[1, 1]), curve(1.0, 1.0, steps=[1, 2]), 0.05)
    assert stepped.verdict == DIFFER and "step at different times" in stepped.reason


def test_compare_without_losses_is_incomplete():
    assert compare([], curve(1.0), 0.05).verdict == INCOMPLETE


def test_a_scale_of_one_is_no_scale():
    """A loss multiplied by 1 is the unscaled loss: not a difference in scaling (with the same skipped steps)."""
    unscaled, by_one = scaling.Scaling([], [None, None]), scaling.Scaling([], [1.0, 1.0])
    assert not scaling.scaling_differs(unscaled, by_one)
    assert scaling.first_scale_difference(unscaled, scaling.Scaling([], [1.0, 2.0])) == 1


def test_scaling_difference_is_skipped_steps_or_scales():
    same = scaling.Scaling([3], [65536.0, 32768.0])
    assert not scaling.scaling_differs(same, scaling.Scaling([3], [65536.0, 32768.0]))
    assert scaling.scaling_differs(same, scaling.Scaling([3, 4], [65536.0, 32768.0]))
    other_scale = scaling.Scaling([3], [65536.0, 16384.0])
    assert scaling.scaling_differs(same, other_scale)
    assert scaling.describe_difference(same, other_scale, [1, 2]) == (
        "original skipped steps [3], migrated skipped [3]; the scales part at loss 2, step 2: 32768 in the "
        "original, 16384 in the migrated script")


@pytest.mark.parametrize("original,migrated,expected", [
    ([65536.0, 8192.0], [65536.0, 16384.0], 8192.0),
    ([1.0, None], [0.5], 2.0),  # never below 2: at 1.0 apexlite checks no overflow while a GradScaler does
    ([None], [None], 65536.0),
])
def test_static_scale_is_the_smallest_either_run_used(original, migrated, expected):
    assert scaling.static_scale_for(scaling.Scaling([], original), scaling.Scaling([], migrated)) == expected


def test_compare_non_finite_losses():
    assert compare(curve(1.0, None), curve(1.0, None), 0.05).verdict == AGREE
    assert compare(curve(1.0, None), curve(1.0, 0.5), 0.05).verdict == DIFFER


SCALED_SCRIPT = """
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    print("loss", repr(loss.item()), flush=True)
    scaler.scale(loss).backward()
    if step == 1:
        model.weight.grad.fill_(float("inf"))  # this step overflows: GradScaler skips it
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""

PLAIN_SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizers = [torch.optim.SGD(model.parameters(), lr=0.01), torch.optim.Adam(model.parameters(), lr=0.01)]
for step in range(10):
    for optimizer in optimizers:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        print("loss", repr(loss.item()), flush=True)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def run_child(tmp_path, source, *args, max_steps=None, allow=()):
    script = tmp_path / "script.py"
    script.write_text(source)
    telemetry = tmp_path / "telemetry.json"
    command = [sys.executable, CHILD, "--telemetry", str(telemetry), *[f"--allow={root}" for root in allow]]
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    result = subprocess.run([*command, str(script), *args], capture_output=True, text=True, timeout=120)
    return result, json.loads(telemetry.read_text())


def printed_losses(stdout):
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


def test_child_records_unscaled_losses_and_counts_skipped_steps(tmp_path):
    result, report = run_child(tmp_path, SCALED_SCRIPT, "5")
    assert result.returncode == 0, result.stderr
    assert report["steps"] == 5 and not report["cut_at_budget"]
    assert [loss for _, loss in report["loss_curve"]] == pytest.approx(printed_losses(result.stdout), rel=1e-7)
    assert [step for step, _ in report["loss_curve"]] == [1, 2, 3, 4, 5]
    # step 2 overflowed: GradScaler skipped it and halved its scale for the losses after it
    assert report["skipped_at"] == [2]
    assert report["loss_scale_curve"] == [[1, 1024.0], [2, 1024.0], [3, 512.0], [4, 512.0], [5, 512.0]]


def test_child_static_scale_holds_every_grad_scaler_at_one_scale(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCALED_SCRIPT)
    telemetry = tmp_path / "telemetry.json"
    result = subprocess.run([sys.executable, CHILD, "--telemetry", str(telemetry), "--static-scale", "64",
                             str(script), "5"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(telemetry.read_text())
    assert report["loss_scale_curve"] == [[step, 64.0] for step in range(1, 6)]
    assert report["skipped_at"] == [2]  # a static scale still skips an overflowing step, as apexlite's does


def test_child_plain_backward_has_no_scale(tmp_path):
    result, report = run_child(tmp_path, PLAIN_SCRIPT, max_steps=3)
    assert result.returncode == 0, result.stderr
    assert report["loss_scale_curve"] == [[1, None], [2, None], [3, None]] and report["skipped_at"] == []


def test_child_budget_ends_the_script_cleanly(tmp_path):
    result, report = run_child(tmp_path, SCALED_SCRIPT, "50", max_steps=3)
    assert result.returncode == 0, result.stderr
    assert report["steps"] == 3 and report["cut_at_budget"] and len(report["loss_curve"]) == 3
    assert len(printed_losses(result.stdout)) == 3


def test_child_counts_plain_optimizer_steps_through_torchs_hook(tmp_path):
    result, report = run_child(tmp_path, PLAIN_SCRIPT, max_steps=7)
    assert result.returncode == 0, result.stderr
    assert report["steps"] == 7
    assert [loss for _, loss in report["loss_curve"]] == pytest.approx(printed_losses(result.stdout), rel=1e-7)
    assert [step for step, _ in report["loss_curve"]] == list(range(1, 8))


@pytest.mark.parametrize("code, status, printed", [("'no data in ./data'", 1, "no data in ./data"), ("3", 3, ""),
                                                   ("None", 0, "")])
def test_child_exits_as_python_does_on_sys_exit(tmp_path, code, status, printed):
    """sys.exit("message") prints the message and exits 1, as python does, so the verdict can quote it."""
    result, report = run_child(tmp_path, f"import sys\nsys.exit({code})\n")
    assert (result.returncode, report["exit_code"]) == (status, status)
    # torch may warn at import (no numpy: "Failed to initialize NumPy"); the script's own lines are the rest
    said = [line for line in result.stderr.splitlines() if line.strip() and "Warning" not in line
            and not line.startswith(" ")]
    assert said == ([printed] if printed else [])


@pytest.mark.parametrize("module", ["apex", "apex.amp", "amp_C", "apexlite"])
def test_child_refuses_apex_and_apexlite(tmp_path, module):
    result, report = run_child(tmp_path, f"import {module}\n")
    root = module.split(".")[0]
    assert result.returncode == 1
    assert f"No module named '{root}' (apexlite migrate --verify runs the migrated script without {root})" in \
        result.stderr
    assert report["refused_imports"] == [root] and report["loaded_refused_modules"] == []


def test_child_may_allow_apexlite_for_o2_kept_on_it(tmp_path):
    result, report = run_child(tmp_path, "import apexlite.amp\n", allow=["apexlite"])
    assert result.returncode == 0, result.stderr
    assert report["refused_imports"] == []


@pytest.fixture(autouse=True)
def _own_folder(tmp_path, monkeypatch):
    """verify watches the files written under the current folder: run from the test's own, so files other
    tests write into the checkout meanwhile are not held aside (migrate/written_files.py)."""
    monkeypatch.chdir(tmp_path)


def _verify(source_path, result, max_steps, *script_args):
    out = io.StringIO()
    status = verify_migration(str(source_path), result, list(script_args), max_steps, 300.0, 0.05, MigrateOptions(),
                              None, out)
    return status, out.getvalue()


@pytest.mark.slow
def test_verify_catches_clipping_before_unscale():
    """A migration that forgets scaler.unscale_ before clipping trains differently: verify says so."""
    path = EXAMPLES / "grad_accumulation_amp.py"
    result = migrate_source(path.read_bytes(), MigrateOptions(opt_level="O1"))
    assert b"    scaler.unscale_(optimizer)\n" in result.migrated
    status, report = _verify(path, result, 6, "--steps", "6")
    assert status == 0, report
    assert "verdict: AGREE" in report
    result.migrated = result.migrated.replace(b"    scaler.unscale_(optimizer)\n", b"")
    status, report = _verify(path, result, 6, "--steps", "6")
    assert status == 1
    assert "verdict: DIFFER (arithmetic): the losses differ by up to" in report
    assert "with the same loss scaling in both runs (skipped steps [1], every loss scaled alike)" in report


@pytest.mark.slow
def test_verify_a_script_without_amp(tmp_path):
    """No amp.initialize (so no apexlite telemetry): the original is recorded by the child under apexlite run."""
    script = tmp_path / "fused.py"
    script.write_text("import torch\nfrom apex.optimizers import FusedAdam\nfrom apex.fp16_utils import to_python_float\n"
                      "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\n"
                      "optimizer = FusedAdam(model.parameters(), lr=1e-2)\n"
                      "for _ in range(20):\n    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
                      "    print(to_python_float(loss))\n    loss.backward()\n    optimizer.step()\n"
                      "    optimizer.zero_grad()\n")
    result = migrate_source(script.read_bytes())
    assert result.exit_status == 0
    status, report = _verify(script, result, 8)
    assert status == 0, report
    assert "original (apexlite run): ok, 8 steps, 8 losses" in report
    assert "verdict: AGREE" in report


DCGAN = EXAMPLES / "dcgan_amp.py"
# batch size 2 makes the example's fp16 gradients overflow now and then: the original's three loss scalers
# (one per loss_id) and the migrated script's two GradScalers (one per optimizer) skip different steps
DCGAN_ARGS = ["--batchSize", "2"]


def _verify_dcgan(result, tolerance):
    out = io.StringIO()
    status = verify_migration(str(DCGAN), result, DCGAN_ARGS, 10, 300.0, tolerance, MigrateOptions(opt_level="O1"),
                              None, out)
    return status, out.getvalue()


@pytest.mark.slow
def test_verify_says_a_gan_differs_by_its_loss_scaling():
    result = migrate_source(DCGAN.read_bytes(), MigrateOptions(opt_level="O1"))
    assert result.exit_status == 0
    status, report = _verify_dcgan(result, 0.01)
    assert status == 1, report
    assert "verify: the loss scaling differs (original skipped steps [3, 4, 5], migrated skipped [3, 4];" in report
    assert "static loss scale 32768): ok, 10 steps, 15 losses" in report
    verdict = report.splitlines()[-1]
    assert verdict.startswith("verify: verdict: DIFFER (loss scaling): the curves differ because the loss scaling "
                              "differs (original skipped steps [3, 4, 5], migrated skipped [3, 4]"), report
    assert "under one static loss scale 32768 they agree within 0.000%" in verdict


@pytest.mark.slow
def test_verify_says_a_broken_gan_migration_differs_in_its_arithmetic():
    """The same GAN with one loss left unscaled (the scaler then divides its gradients by the scale): the runs
    still differ under one static scale, so verify blames the arithmetic."""
    result = migrate_source(DCGAN.read_bytes(), MigrateOptions(opt_level="O1"))
    scaled = b"scaler_optimizerD.scale(errD_fake).backward()"
    assert result.migrated.count(scaled) == 1
    result.migrated = result.migrated.replace(scaled, b"errD_fake.backward()")
    status, report = _verify_dcgan(result, 0.01)
    assert status == 1, report
    assert "verify: the loss scaling differs" in report
    assert report.splitlines()[-1].startswith("verify: verdict: DIFFER (arithmetic): under one static loss scale "), \
        report


DISTILL = ROOT / "tests" / "migrate" / "golden" / "distill_teacher.in.py"


@pytest.mark.slow
def test_verify_says_a_migration_that_left_a_training_forward_in_float32_differs():
    """The losses agree, but the student's forward outside autocast ran in float32 where apex's O1 ran it in
    float16: verify counts the layers' dtypes and says DIFFER (precision); the migration as made agrees, with
    a note for the teacher's no_grad forward that runs in float32 now."""
    result = migrate_source(DISTILL.read_bytes(), MigrateOptions(opt_level="O1"))
    status, report = _verify(DISTILL, result, 4)
    assert status == 0, report
    assert "while training: original 100% (8 of 8), migrated 100% (8 of 8)" in report
    assert "verify: note: forwards under no_grad run in float32 now" in report
    region = b'    with torch.autocast(device_type="cpu", dtype=torch.float16):\n'
    forward = b"        logits = student(x)\n"
    assert result.migrated.count(region + b"        with torch.no_grad():\n            soft = teacher(x)\n" + forward) == 1
    result.migrated = result.migrated.replace(forward, b"").replace(region, b"    logits = student(x)\n" + region)
    status, report = _verify(DISTILL, result, 4)
    assert status == 1, report
    assert "while training: original 100% (8 of 8), migrated 0% (0 of 8)" in report
    assert report.splitlines()[-1] == (
        "verify: verdict: DIFFER (precision): the losses agree, but the migrated script ran 100% of its training "
        "layers in float32, where the original ran 100% of them in low precision: a forward pass is outside "
        "torch.autocast; put it under the autocast region of its loss"), report


RESUMING_SCRIPT = """
import os
import torch
from apex import amp

CHECKPOINT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume.pt")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1", loss_scale=128.0)
if os.path.exists(CHECKPOINT):
    saved = torch.load(CHECKPOINT)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
data = torch.randn(8, 4)
for step in range(20):
    loss = model(data).pow(2).mean()
    print(loss.item())
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, CHECKPOINT)
"""


@pytest.mark.slow
def test_verify_starts_the_migrated_run_without_the_checkpoint_the_original_wrote(tmp_path):
    """A script that resumes from its own checkpoint: the original run's checkpoint is held aside while the
    migrated run runs, so both start from scratch (it resumed from trained weights and the losses differed by
    81%); at the end the folder holds what running both leaves: the migrated run's checkpoint."""
    script = tmp_path / "resuming.py"
    script.write_text(RESUMING_SCRIPT)
    result = migrate_source(script.read_bytes())
    assert result.exit_status == 0
    status, report = _verify(script, result, 4)
    assert status == 0, report
    assert "verdict: AGREE" in report
    checkpoint = "resume.pt"  # (named from the current folder, the test's own)
    assert f"verify: note: the original run created {checkpoint}; held aside while the next run ran, so that it " \
           "started from the same files" in report
    assert f"verify: note: the migrated run created {checkpoint}\n" in report
    assert sorted(path.name for path in tmp_path.iterdir()) == ["resume.pt", "resuming.py"]
    assert len(torch.load(tmp_path / checkpoint)["model"]) == 2
