"""Each rewrite against a reviewed golden file: tests/migrate/golden/<case>.in.py -> <case>.out.py.

cases.tsv gives each case's migrate options and exit status. Besides the exact bytes, every output
compiles, migrating it again changes nothing (no TODO is added twice), and `check` finds no apex API
left in a complete migration, or names what is left when there are TODOs.
"""
import ast
import csv
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from apexlite import check
from apexlite.migrate.cli import migrate_options, parse_arguments
from apexlite.migrate.edits import TODO_PREFIX
from apexlite.migrate.engine import migrate_source

GOLDEN = Path(__file__).with_name("golden")
with open(GOLDEN / "cases.tsv", newline="") as handle:
    CASES = [(row["name"], row["options"], int(row["exit"])) for row in csv.DictReader(handle, delimiter="\t")]


def _migrate(name, options):
    args, _ = parse_arguments([str(GOLDEN / f"{name}.in.py"), *shlex.split(options)])
    return migrate_source((GOLDEN / f"{name}.in.py").read_bytes(), migrate_options(args)), migrate_options(args)


@pytest.mark.parametrize("name,options,status", CASES, ids=[case[0] for case in CASES])
def test_golden_output(name, options, status):
    result, _ = _migrate(name, options)
    assert result.migrated == (GOLDEN / f"{name}.out.py").read_bytes()
    assert result.exit_status == status
    assert result.error is None
    assert len(result.todos) == result.migrated.count(TODO_PREFIX.encode())
    assert (status == 1) == bool(result.todos)


@pytest.mark.parametrize("name,options,status", CASES, ids=[case[0] for case in CASES])
def test_golden_output_compiles_and_check_agrees(name, options, status):
    result, _ = _migrate(name, options)
    compile(result.migrated, name, "exec", dont_inherit=True)
    left = check.scan(ast.parse(result.migrated))
    assert result.remaining == left
    if status == 0:
        assert left == [], f"a complete migration still uses {left}"
    else:
        assert left, "a migration with TODOs left no apex API for check to name"


@pytest.mark.parametrize("name,options,status", CASES, ids=[case[0] for case in CASES])
def test_migrating_twice_changes_nothing(name, options, status):
    result, migrate_options_ = _migrate(name, options)
    again = migrate_source(result.migrated, migrate_options_)
    assert again.migrated == result.migrated
    assert len(again.todos) == len(result.todos)


def test_every_case_has_its_files():
    inputs = {path.name[:-len(".in.py")] for path in GOLDEN.glob("*.in.py")}
    outputs = {path.name[:-len(".out.py")] for path in GOLDEN.glob("*.out.py")}
    assert inputs == outputs == {name for name, _, _ in CASES}


# golden case -> a line appended to its input and its output that prints what the model returns
RUN_AND_PRINT = {"o3": "print(model(torch.randn(2, 4)).dtype)", "gan_forward_first": "print(fake.dtype)",
                 "eval_forward": "print(evaluate(torch.randn(2, 8)).dtype)", "distill_teacher": "print(soft.dtype)",
                 "clip_model_params": "print(float(grad_norm) < 1000)",  # scaled grads: a norm near 2**16 times larger
                 "backward_helper": "print(out.dtype)", "step_before_backward": "print(torch.isfinite(loss).item())",
                 "nested_flag_guards": "print(outputs.dtype)",
                 "clip_branch_without_accumulation": "print(float(last_norm) < 1000)",
                 "o3_batchnorm_kept": "print(model[1].weight.dtype, f'{float(loss):.6f}')",
                 "o3_fp16_loss_scale_kept": "print(model[0].weight.dtype, f'{float(loss):.6f}')",
                 "trainer_class": "print(float(trainer.grad_norm) < 1000)", "trainer_class_gan": "print(fake.dtype)",
                 "trainer_class_clip": "print(f'{trainer.last_loss:.3f}')",
                 "warmup_backward_cleared": "print(f'{loss.item():.3f}')"}


@pytest.mark.parametrize("name", list(RUN_AND_PRINT))
def test_the_migrated_model_returns_what_apex_returned_or_says_it_does_not(tmp_path, name):
    """The original under `apexlite run` (apex's behaviour) against the migrated script under plain python:
    O3's output back in float32, a GAN's generator output and a distillation teacher's in float16; an evaluation forward runs in float32
    after the migration, which its comment says."""
    printed = []
    for kind, command in (("in", [sys.executable, "-m", "apexlite", "run"]), ("out", [sys.executable])):
        script = tmp_path / f"{name}.{kind}.py"
        script.write_bytes((GOLDEN / f"{name}.{kind}.py").read_bytes() + f"\n{RUN_AND_PRINT[name]}\n".encode())
        result = subprocess.run([*command, str(script)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        printed.append(result.stdout.strip().splitlines()[-1])
    if name == "eval_forward":
        assert printed == ["torch.float16", "torch.float32"]
        assert b"runs in float32 now" in (GOLDEN / f"{name}.out.py").read_bytes()
    else:
        assert printed[0] == printed[1], printed
