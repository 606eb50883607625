"""Mixed precision is never dropped silently (apexlite.migrate.proof).

scripts/timm_shaped/ is a two-file reproduction of timm's pattern (efficientdet-pytorch's and GPUNet's
train.py): amp.initialize under `elif use_amp == "apex":`, the forward under `with amp_autocast():` in a
function that receives `amp_autocast` as an argument, `amp_autocast = suppress` on the apex path, and the
loss scaled by `loss_scaler = utils.ApexScaler()`, whose class (in utils.py) calls amp.scale_loss itself;
validate.py is the inference side (amp.initialize of the model alone, the forward under amp_autocast).
Migrated alone or together, migrate cannot find a forward pass or a loss scaling tied to amp.initialize, so
the amp part stays with one TODO saying what to write, and the status is 1. Following that TODO to the
letter gives a script that trains in mixed precision with a GradScaler, with apex and apexlite unimportable.
"""
import re
from pathlib import Path

import pytest

from apexlite.migrate.edits import TODO_PREFIX
from apexlite.migrate.engine import migrate_source, migrate_sources
from tests._helpers.isolated import run_isolated

HERE = Path(__file__).parent
FOLDER = HERE / "scripts" / "timm_shaped"
AMP_LINES = ('        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n',
             "        loss_scaler = utils.ApexScaler()\n")


def _todo(result):
    assert len(result.todos) == 1, result.todos
    return result.todos[0].message


@pytest.mark.parametrize("together", [False, True], ids=["train.py alone", "with utils.py"])
def test_the_timm_pattern_keeps_its_amp_with_one_todo_and_exit_1(together):
    train = FOLDER / "train.py"
    if together:
        results = migrate_sources({train: train.read_bytes(), FOLDER / "utils.py": (FOLDER / "utils.py").read_bytes()})
        result = results[train]
        assert results[FOLDER / "utils.py"].exit_status == 1
    else:
        result = migrate_source(train.read_bytes())
    assert result.exit_status == 1 and result.error is None
    migrated = result.migrated.decode()
    assert all(line in migrated for line in AMP_LINES)  # the amp part is untouched
    assert "torch.amp.GradScaler(" not in migrated and "# apexlite migrate:" not in migrated  # nothing claimed
    todo = _todo(result)
    assert "removing it would drop mixed precision" in todo
    assert ("set `amp_autocast = functools.partial(torch.autocast, device_type=next(model.parameters()).device.type, "
            "dtype=torch.float16)` here (it stays `suppress` on this path") in todo
    assert "replace `loss_scaler = utils.ApexScaler()`" in todo and "timm's NativeScaler" in todo
    assert migrated.count(TODO_PREFIX) == 1
    assert migrated.index(TODO_PREFIX) < migrated.index(AMP_LINES[0])  # right above amp.initialize


def test_inference_amp_keeps_its_amp_with_one_todo():
    result = migrate_source((FOLDER / "validate.py").read_bytes())
    assert result.exit_status == 1
    todo = _todo(result)
    assert "runs the forward passes in float16, but migrate tied no amp.scale_loss to it" in todo
    assert "set `amp_autocast = functools.partial(torch.autocast, device_type=\"cuda\", dtype=torch.float16)`" in todo
    assert "scale" not in todo.split("By hand:")[1]  # no optimizer: nothing to scale, nothing said about it
    assert b"amp.initialize(bench, opt_level=\"O1\")" in result.migrated


def test_a_script_without_such_a_context_gets_the_plain_autocast_instruction():
    source = b"""import torch
from apex import amp

model = torch.nn.Linear(4, 2).cuda()
model = amp.initialize(model, opt_level="O1")
if True:
    print(model(torch.randn(3, 4).cuda()))
"""
    todo = _todo(migrate_source(source))
    assert 'put the forward pass under `with torch.autocast(device_type="cuda", dtype=torch.float16):`' in todo


def _followed(source: str, todo: str) -> str:
    """train.py with the TODO done as it says: its `amp_autocast = ...` line in place of amp.initialize, a
    GradScaler-based scaler (utils.NativeScaler) in place of ApexScaler, the apex import deleted."""
    autocast = re.search(r"set `(amp_autocast = [^`]+)` here", todo).group(1)
    assert "utils.ApexScaler()" in todo
    source = source.replace(AMP_LINES[0], f"        {autocast}\n")
    source = source.replace(AMP_LINES[1], "        loss_scaler = utils.NativeScaler(device)\n")
    source = source.replace("    from apex import amp\n", "")
    return "import functools\n" + source


def test_following_the_todo_trains_in_mixed_precision_with_neither_apex_nor_apexlite(tmp_path):
    result = migrate_source((FOLDER / "train.py").read_bytes())
    script = tmp_path / "train.py"
    script.write_text(_followed(result.migrated.decode(), _todo(result)))
    (tmp_path / "utils.py").write_bytes((FOLDER / "utils.py").read_bytes())
    ran = run_isolated(script, "--apex-amp", timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    steps = re.findall(r"loss ([\d.]+) dtype (\S+) scaler (\S+)", ran.stdout)
    assert len(steps) == 3
    assert {(dtype, scaler) for _, dtype, scaler in steps} == {("torch.float16", "NativeScaler")}


def test_without_following_it_the_apex_path_would_train_in_fp32(tmp_path):
    """What the TODO guards against: amp.initialize deleted and nothing else done (what migrate once wrote)."""
    source = (FOLDER / "train.py").read_text().replace(AMP_LINES[0], "").replace("    from apex import amp\n", "")
    source = source.replace(AMP_LINES[1], "        loss_scaler = utils.NativeScaler(device)\n")
    script = tmp_path / "train.py"
    script.write_text(source)
    (tmp_path / "utils.py").write_bytes((FOLDER / "utils.py").read_bytes())
    ran = run_isolated(script, "--apex-amp", timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert set(re.findall(r"dtype (\S+)", ran.stdout)) == {"torch.float32"}
