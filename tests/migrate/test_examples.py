"""Round trips on the project's own legacy examples (examples/*.py).

Each migrated example (1) trains like the original: `migrate --verify` runs the original under
`apexlite run` and the migrated script under plain python with apex refused, and the loss curves agree;
and (2) runs on torch alone: a child `python -I -S` whose sys.path holds only the script's folder and
torch's site-packages folder, where neither apexlite nor apex can be found (the child asserts it).
O2 kept on apexlite is the exception to (2) by design: it imports apexlite.
"""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._helpers import isolated

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 600

# (example, migrate options, script arguments, --max-steps, whether the result needs apexlite)
CASES = [
    ("grad_accumulation_amp.py", ["--opt-level", "O1"], ["--steps", "5"], 5, False),
    ("grad_accumulation_amp.py", ["--opt-level", "O2", "--o2=bf16-autocast"], ["--steps", "5"], 5, False),
    ("grad_accumulation_amp.py", ["--opt-level", "O3"], ["--steps", "5"], 5, False),
    ("dcgan_amp.py", ["--opt-level", "O1"], ["--iters-per-epoch", "3"], 6, False),
    ("long_training_amp.py", ["--opt-level", "O1"],
     ["--print-freq", "1", "--epochs", "1", "--steps-per-epoch", "6"], 6, False),
    ("fused_adam_o2.py", ["--opt-level", "O2"], ["--steps", "6"], 6, True),
]
LOSS_PATTERN = {"dcgan_amp.py": r"Loss_D: ([\d.]+)"}
IDS = [f"{name[:-3]}-{'-'.join(options).replace('--', '')}" for name, options, *_ in CASES]


def migrate(*args, cwd=ROOT):
    """`--verify` watches the files written under its folder (migrate/written_files.py): tests that verify run
    from their own tmp_path, so files other tests write into the checkout meanwhile are not held aside."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    return subprocess.run([sys.executable, "-m", "apexlite", "migrate", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=TIMEOUT_S, env=env)


def run_isolated(script, *args, env=None):
    return isolated.run_isolated(script, *args, timeout=TIMEOUT_S, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("name,options,script_args,steps,needs_apexlite", CASES, ids=IDS)
def test_migrated_example_trains_like_the_original_and_runs_on_torch_alone(tmp_path, name, options, script_args,
                                                                           steps, needs_apexlite):
    out = tmp_path / name
    result = migrate(EXAMPLES / name, *options, "-o", out, "--verify", "--max-steps", steps, "--", *script_args,
                     cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = "kept on apexlite, not migrated to native torch.amp" if needs_apexlite else "migrated completely"
    assert outcome in result.stdout and "check: no apex APIs used" in result.stdout
    assert "apex imports refused in the migrated run: none attempted" in result.stdout
    assert "verdict: AGREE" in result.stdout, result.stdout
    assert ("from apexlite import amp" in out.read_text()) == needs_apexlite
    if needs_apexlite:  # O2 kept on apexlite imports it by design
        return
    ran = run_isolated(out, *script_args)
    assert ran.returncode == 0, ran.stderr[-3000:]
    losses = [float(value) for value in re.findall(LOSS_PATTERN.get(name, r" loss ([\d.]+)"), ran.stdout)]
    assert len(losses) >= 3
    if name != "dcgan_amp.py":  # a GAN's losses need not fall
        assert losses[-1] < losses[0]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# opt level -> what apex's DDP became, and whether the migrated script runs on torch alone
DISTRIBUTED = {"O1": ("torch.nn.parallel.DistributedDataParallel(model)", True),
               "O2": ("from apexlite.parallel import ddp_from_apex_args as DistributedDataParallel", False)}


@pytest.mark.slow
@pytest.mark.parametrize("level", list(DISTRIBUTED))
def test_migrated_distributed_example_keeps_ranks_in_sync(tmp_path, level):
    """apex.parallel.DistributedDataParallel -> torch's (O1, on torch alone), or apexlite's (O2 kept on
    apexlite: it broadcasts rank 0's fp32 masters; the ranks start from different weights), two gloo
    processes."""
    out = tmp_path / "distributed_amp.py"
    result = migrate(EXAMPLES / "distributed_amp.py", "--opt-level", level, "-o", out)
    assert result.returncode == 0, result.stdout + result.stderr
    became, torch_alone = DISTRIBUTED[level]
    assert became in out.read_text()
    command = isolated.isolated_command(out, "--steps", "4", "--opt-level", level) if torch_alone else [
        sys.executable, str(out), "--steps", "4", "--opt-level", level]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen(command,
                              env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append((proc.returncode, *proc.communicate(timeout=TIMEOUT_S)))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, (_, stdout, stderr)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, stderr[-3000:]
        assert f"rank {rank}: weights identical on all 2 ranks" in stdout


@pytest.mark.slow
def test_imagenet_example_migrates_completely_and_trains_on_torch_alone(tmp_path):
    """With the run-time choices given (--opt-level, --loss-scale), everything migrates, the print of
    `multi_tensor_applier.available` included (always True under torch), and the script runs on torch
    alone."""
    out = tmp_path / "imagenet_amp.py"
    result = migrate(EXAMPLES / "imagenet_amp.py", "--opt-level", "O1", "--loss-scale", "dynamic", "-o", out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "migrated completely" in result.stdout and "check: no apex APIs used" in result.stdout
    assert not re.search(r"(?m)^\s*(from|import) apex\b", out.read_text())  # the docstring may still name apex
    ran = run_isolated(out, "--steps-per-epoch", "4")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "multi_tensor_applier.available = True" in ran.stdout
    assert ran.stdout.count("loss_scale 65536.0") == 4
    assert "checkpoint state_dict dtypes: torch.float32" in ran.stdout


@pytest.mark.slow
def test_imagenet_example_names_every_blocker_in_one_run(tmp_path):
    """Without them, one run names both run-time choices and the flags a second run needs."""
    result = migrate(EXAMPLES / "imagenet_amp.py", "-o", tmp_path / "out.py")
    assert result.returncode == 1
    todos = [line for line in result.stdout.splitlines() if line.startswith("  TODO ")]
    assert len(todos) == 2 and "opt_level is chosen at run time" in todos[0] and "loss_scale" in todos[1]
    assert "2 places left for you" in result.stdout
    assert "run migrate again with --opt-level O1 --loss-scale dynamic" in result.stdout
