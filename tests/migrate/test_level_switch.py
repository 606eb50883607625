"""An opt level a flag switches between O0 (plain fp32) and another level: migrated as that level, enabled by
the flag (Mask R-CNN's `amp_opt_level = 'O1' if use_mixed_precision else 'O0'` became fp16 on every run)."""
import pytest

from apexlite.migrate.engine import migrate_source
from apexlite.migrate.options import MigrateOptions

SCRIPT = """
import torch
from apex import amp
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{setup}
model, optimizer = amp.initialize(model, optimizer, {arguments})
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
"""
ENABLED = 'with torch.autocast(device_type="cpu", dtype=torch.float16, enabled={flag}):'


@pytest.mark.parametrize("setup, arguments, flag", [
    ("fp16 = True", 'opt_level="O1" if fp16 else "O0"', "fp16"),
    ('half = input() == "y"\nlevel = "O1" if half else "O0"', "opt_level=level", "bool(half)"),
])
def test_the_flag_enables_the_other_level(setup, arguments, flag):
    result = migrate_source(SCRIPT.format(setup=setup, arguments=arguments).encode())
    assert result.exit_status == 0, result.todos
    migrated = result.migrated.decode()
    assert ENABLED.format(flag=flag) in migrated
    assert f'scaler = torch.amp.GradScaler("cpu", enabled={flag})' in migrated
    assert f"enabled when `{flag}` (its opt_level is O1 then, O0 otherwise)" in " ".join(
        line.strip("# ") for line in migrated.splitlines())


@pytest.mark.parametrize("setup, arguments, todo", [
    ("fp16 = True", 'opt_level="O0" if fp16 else "O1"', "opt_level is chosen at run time"),
    ("fp16 = True", 'opt_level="O1" if fp16 else "O0", enabled=fp16', "enabled= is given too"),
    ("fp16 = True\nlevel = 'O1' if fp16 else 'O0'\nlevel = 'O2'", "opt_level=level", "opt_level is chosen at run time"),
])
def test_other_forms_stay_a_run_time_choice(setup, arguments, todo):
    result = migrate_source(SCRIPT.format(setup=setup, arguments=arguments).encode())
    assert result.exit_status == 1 and any(todo in text for text in map(str, result.todos)), result.todos


def test_an_opt_level_option_for_another_level_is_said_unused():
    result = migrate_source(SCRIPT.format(setup="fp16 = True", arguments='opt_level="O1" if fp16 else "O0"').encode(),
                            MigrateOptions(opt_level="O2"))
    assert result.exit_status == 0
    assert "--opt-level O2 not used: the script's opt_level is O1 when `fp16`, else O0, which is what was migrated" \
        in result.notes


DDP_SCRIPT = """
import apex
import torch
from apex import amp
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level=params.amp_level)
model = apex.parallel.DistributedDataParallel(model, delay_allreduce=True)
"""


@pytest.mark.parametrize("level, torch_ddp", [(None, False), ("O2", False), ("O1", True)])
def test_apexs_ddp_becomes_torchs_only_where_amp_cannot_run_o2(level, torch_ddp):
    """XLM's trainer: a run-time opt level that may be O2 keeps apex's DDP semantics (a TODO naming
    ddp_from_apex_args); with --opt-level O1 the migration is native and torch's DDP is right."""
    result = migrate_source(DDP_SCRIPT.encode(), MigrateOptions(opt_level=level))
    migrated = result.migrated.decode()
    assert ("torch.nn.parallel.DistributedDataParallel(" in migrated) == torch_ddp
    assert any("ddp_from_apex_args" in str(todo) for todo in result.todos) == (not torch_ddp)


@pytest.mark.parametrize("arguments, enabled", [
    ("opt_level=level", 'enabled=level != "O0"'),
    ("opt_level=level, enabled=fp16", 'enabled=fp16 and level != "O0"'),
    ('opt_level=level if fp16 else "O0"', 'enabled=(level if fp16 else "O0") != "O0"'),
])
def test_a_run_time_o0_stays_fp32_after_migrating_another_level(arguments, enabled):
    """A level chosen at run time, migrated for O1 by --opt-level: the run that picks O0 trains in fp32 as the
    original did at O0 (weights bit for bit), the run that picks O1 under autocast."""
    import torch

    from apexlite import amp

    source = SCRIPT.format(setup="fp16 = True\nlevel = LEVEL_FROM_RUN", arguments=arguments)
    result = migrate_source(source.encode(), MigrateOptions(opt_level="O1"))
    assert result.exit_status == 0, result.todos
    migrated = result.migrated.decode()
    assert f'scaler = torch.amp.GradScaler("cpu", {enabled})' in migrated
    assert "O0 at run time is fp32" in " ".join(line.strip("# ") for line in migrated.splitlines())
    for level, dtype in (("O0", torch.float32), ("O1", torch.float16)):
        runs = []
        for code, use_amp in ((source.replace("from apex import amp\n", ""), True), (migrated, False)):
            namespace = {"LEVEL_FROM_RUN": level, **({"amp": amp} if use_amp else {})}
            torch.manual_seed(0)
            try:
                exec(compile(code, "<script>", "exec"), namespace)
            finally:
                amp.deinitialize()
            runs.append(namespace)
        assert runs[1]["loss"].dtype == dtype  # autocast's sum stays float16 (O1's runs in fp32)
        if level == "O0":
            assert runs[0]["loss"].dtype == torch.float32
            assert torch.equal(runs[0]["model"].weight, runs[1]["model"].weight)


def test_a_run_time_opt_level_migrate_cannot_evaluate_again_is_a_todo():
    """`opt_level=os.environ.get(...)` (a call): no `enabled=` can repeat it, and without one a run choosing O0
    would train in fp16, so migrate says what to write rather than call the rewrite complete."""
    source = SCRIPT.format(setup="import os", arguments='opt_level=os.environ.get("OPT_LEVEL", "O1")')
    result = migrate_source(source.encode(), MigrateOptions(opt_level="O1"))
    assert result.exit_status == 1
    assert any("cannot evaluate again to turn autocast and the GradScaler off when it is O0" in str(todo)
               for todo in result.todos), result.todos
