"""migrate_sources: files migrated together, amp followed from the file that calls amp.initialize into the
files that use its optimizer (a train() it calls with it, an import of it), or TODOs in both files."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apexlite.migrate.edits import TODO_PREFIX
from apexlite.migrate.engine import migrate_sources
from tests.migrate.test_examples import ROOT, TIMEOUT_S, run_isolated

TWO_FILES = Path(__file__).with_name("scripts") / "two_files"


def _sources(files):
    return {Path("repo", f"{name}.py"): text.encode() for name, text in files.items()}


MAIN = """import torch
from apex import amp
from pkg.trainer import train


def main():
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for epoch in range(2):
        train(loader, model, optimizer, epoch)
"""
TRAINER = """from apex import amp


def train(loader, model, optimizer, epoch):
    for inputs, target in loader:
        loss = (model(inputs) - target).pow(2).mean()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""


def test_a_train_function_in_another_module_gets_the_grad_scaler_from_its_caller():
    results = migrate_sources(_sources({"main": MAIN, "pkg/trainer": TRAINER, "pkg/__init__": ""}))
    main, trainer = results[Path("repo/main.py")], results[Path("repo/pkg/trainer.py")]
    assert main.exit_status == trainer.exit_status == 0 and main.remaining == trainer.remaining == []
    assert b'scaler = torch.amp.GradScaler("cuda")' in main.migrated
    assert b"train(loader, model, optimizer, epoch, scaler=scaler)" in main.migrated
    assert b"def train(loader, model, optimizer, epoch, *, scaler):" in trainer.migrated
    assert b"scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()" in trainer.migrated
    assert any("train() now takes the GradScaler" in note for note in trainer.notes)
    assert results[Path("repo/pkg/__init__.py")].migrated == b""


def test_an_imported_optimizer_brings_the_grad_scaler_with_it():
    setup = ("import torch\nfrom apex import amp\nmodel = torch.nn.Linear(2, 2).cuda()\n"
             "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
             "model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n")
    loop = ("from apex import amp\nfrom setup_amp import model, optimizer\n\n\ndef step(x):\n"
            "    loss = model(x).sum()\n    with amp.scale_loss(loss, optimizer) as scaled:\n"
            "        scaled.backward()\n    optimizer.step()\n")
    results = migrate_sources(_sources({"setup_amp": setup, "loop": loop}))
    migrated = results[Path("repo/loop.py")].migrated.decode()
    assert results[Path("repo/loop.py")].exit_status == 0
    assert "from setup_amp import model, optimizer, scaler\n" in migrated
    assert "with torch.autocast(device_type=\"cuda\", dtype=torch.float16):\n        loss = model(x).sum()" in migrated


def test_when_one_file_cannot_be_tied_both_keep_amp_and_name_each_other():
    handed_on = TRAINER + "\n\nSTEPS = {\"train\": train}\n"
    sources = _sources({"main": MAIN, "pkg/trainer": handed_on})
    results = migrate_sources(sources)
    main, trainer = results[Path("repo/main.py")], results[Path("repo/pkg/trainer.py")]
    assert main.exit_status == trainer.exit_status == 1
    assert main.migrated.count(TODO_PREFIX.encode()) == 1 and trainer.migrated.count(TODO_PREFIX.encode()) == 1
    assert "migrated together with pkg/trainer.py:7" in main.todos[0].message
    assert "(main.py:9)" in trainer.todos[0].message
    assert b"amp.initialize(model, optimizer" in main.migrated and b"amp.scale_loss(" in trainer.migrated


def test_a_device_known_only_at_run_time_travels_with_the_grad_scaler():
    main = MAIN.replace(".cuda()", ".to(args.device)")
    results = migrate_sources(_sources({"main": main, "pkg/trainer": TRAINER}))
    main_out, trainer = results[Path("repo/main.py")], results[Path("repo/pkg/trainer.py")]
    assert main_out.exit_status == trainer.exit_status == 0
    assert b"amp_device_type = next(model.parameters()).device.type" in main_out.migrated
    assert b"train(loader, model, optimizer, epoch, scaler=scaler, amp_device_type=amp_device_type)" in \
        main_out.migrated
    assert b"def train(loader, model, optimizer, epoch, *, scaler, amp_device_type):" in trainer.migrated
    assert b"with torch.autocast(device_type=amp_device_type, dtype=torch.float16):" in trainer.migrated


def test_two_initialize_calls_elsewhere_are_named():
    twice = MAIN.replace("    for epoch", "    model, optimizer = amp.initialize(model, optimizer)\n    for epoch")
    results = migrate_sources(_sources({"main": twice, "pkg/trainer": TRAINER}))
    trainer = results[Path("repo/pkg/trainer.py")]
    assert trainer.exit_status == 1
    assert "amp.initialize is called more than once (main.py:9, main.py:10)" in trainer.todos[0].message


def test_files_are_returned_in_order_and_an_unparsable_one_keeps_its_bytes():
    sources = _sources({"broken": "def f(:\n", "main": MAIN, "pkg/trainer": TRAINER})
    results = migrate_sources(sources)
    assert list(results) == list(sources)
    broken = results[Path("repo/broken.py")]
    assert broken.migrated == broken.original and "libcst cannot parse it" in broken.error
    assert results[Path("repo/main.py")].exit_status == 0


def test_files_without_a_shared_initialize_migrate_alone():
    steps = ("loss = model(torch.randn(2, 4).cuda()).sum()\n        with amp.scale_loss(loss, optimizer) as scaled:\n"
             "            scaled.backward()\n        optimizer.step()")
    other = MAIN.replace("from pkg.trainer import train\n", "").replace("train(loader, model, optimizer, epoch)",
                                                                        steps)
    results = migrate_sources(_sources({"a": other, "b": other}))
    assert all(result.exit_status == 0 for result in results.values())


def _losses(stdout):
    return [float(value) for value in re.findall(r"loss ([\d.]+)", stdout)]


@pytest.mark.slow
def test_two_migrated_files_train_like_the_originals_on_torch_alone(tmp_path):
    original = tmp_path / "original"
    shutil.copytree(TWO_FILES, original)
    migrated = tmp_path / "migrated"
    migrated.mkdir()
    files = sorted(original.glob("*.py"))
    for path, result in migrate_sources({path: path.read_bytes() for path in files}).items():
        assert result.exit_status == 0, result.todos
        (migrated / path.name).write_bytes(result.migrated)
    before = subprocess.run([sys.executable, "-m", "apexlite", "run", str(original / "train_main.py")],
                            capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S)
    assert before.returncode == 0, before.stderr[-3000:]
    after = run_isolated(migrated / "train_main.py")
    assert after.returncode == 0, after.stderr[-3000:]
    assert len(_losses(before.stdout)) == 6 and _losses(after.stdout) == pytest.approx(_losses(before.stdout),
                                                                                        rel=1e-3)
    assert "loss scale 65536.0" in before.stdout and "loss scale 65536.0" in after.stdout


CALLER = """from pkg.trainer import train


def fine_tune(loader, model, optimizer):
    train(loader, model, optimizer, 0)
"""


def test_a_file_that_never_names_apex_but_calls_the_train_function_is_seen(monkeypatch):
    """Files naming no apex are read only when they can reach amp's files (their text names the module):
    a caller of train() that migrate did not read would lose its scaler silently."""
    from apexlite.migrate import engine

    parsed = []
    parse = engine.parse
    monkeypatch.setattr(engine, "parse", lambda source: parsed.append(source) or parse(source))
    unrelated = "import os\nprint(os.sep)\n"
    results = migrate_sources(_sources({"main": MAIN, "pkg/trainer": TRAINER, "tools/finetune": CALLER,
                                        "tools/unrelated": unrelated}))
    assert unrelated.encode() not in parsed and CALLER.encode() in parsed
    assert results[Path("repo/tools/unrelated.py")].migrated == unrelated.encode()
    caller = results[Path("repo/tools/finetune.py")]
    # the caller passes an optimizer migrate cannot tie to amp's: train() cannot take the GradScaler, both
    # sides keep amp and say so, rather than a train() that the caller would call without its scaler
    assert results[Path("repo/pkg/trainer.py")].exit_status == 1
    assert caller.migrated == CALLER.encode()


def test_a_folder_is_migrated_jointly_from_the_command_line(tmp_path):
    """`migrate DIR -o OUT`: the two-file example comes out with the GradScaler passed from one file into the
    other, and one summary table."""
    out = tmp_path / "out"
    ran = subprocess.run([sys.executable, "-m", "apexlite", "migrate", str(TWO_FILES), "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "train(batches, model, criterion, optimizer, scaler=scaler)" in (out / "train_main.py").read_text()
    assert "def train(batches, model, criterion, optimizer, *, scaler):" in (out / "train_loop.py").read_text()
    assert "train_main.py" in ran.stdout and "train_loop.py" in ran.stdout
