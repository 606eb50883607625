"""Every example runs unchanged through `python -m apexlite run` on CPU, briefly, and learns."""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 120


def run_example(name, *args, env=None):
    cmd = [sys.executable, "-m", "apexlite", "run", str(EXAMPLES / name), *args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}  # no inherited overrides
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=full_env)


def floats(pattern, text):
    return [float(v) for v in re.findall(pattern, text)]


def test_imagenet_o1_dynamic_scale_and_fp32_checkpoint():
    result = run_example("imagenet_amp.py", "--opt-level", "O1", "--steps-per-epoch", "4")
    assert result.returncode == 0, result.stderr
    assert floats(r"loss_scale ([\d.]+)", result.stdout) == [65536.0] * 4
    assert "checkpoint state_dict dtypes: torch.float32" in result.stdout


def test_imagenet_o2_flags_reach_amp():
    result = run_example("imagenet_amp.py", "--opt-level", "O2", "--keep-batchnorm-fp32", "True",
                         "--loss-scale", "128.0", "--steps-per-epoch", "4")
    assert result.returncode == 0, result.stderr
    assert floats(r"loss_scale ([\d.]+)", result.stdout) == [128.0] * 4
    assert "keep_batchnorm_fp32    : True" in result.stderr  # the options banner
    assert "checkpoint state_dict dtypes: torch.float32" in result.stdout  # fp16 model, fp32 checkpoint
    losses = floats(r" loss ([\d.]+)", result.stdout)
    assert all(0 < value < 10 for value in losses)


def test_imagenet_without_opt_level_fails_like_apex():
    result = run_example("imagenet_amp.py", "--steps-per-epoch", "1")
    assert result.returncode == 1
    assert "Unexpected optimization level None" in result.stderr
    assert "imagenet_amp.py" in result.stderr  # a traceback into the script, as `python script` gives


def test_dcgan_three_losses_two_optimizers():
    result = run_example("dcgan_amp.py", "--iters-per-epoch", "3")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("[0/1]")]
    assert len(lines) == 3
    assert all("loss_scales: [65536.0, 65536.0, 65536.0]" in line for line in lines)


def test_grad_accumulation_with_clipping_learns():
    result = run_example("grad_accumulation_amp.py", "--opt-level", "O2", "--steps", "8")
    assert result.returncode == 0, result.stderr
    losses = floats(r"step \d+ loss ([\d.]+)", result.stdout)
    assert len(losses) == 8 and losses[-1] < 0.8 * losses[0]


def test_fused_adam_o2_keeps_fp32_masters_and_learns():
    result = run_example("fused_adam_o2.py", "--steps", "10")
    assert result.returncode == 0, result.stderr
    assert "model dtype torch.float16 master dtype torch.float32" in result.stdout
    losses = floats(r"step \d+ loss ([\d.]+)", result.stdout)
    assert losses[-1] < losses[0]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("opt_level", ["O1", "O2"])  # O2: fp32 masters built per rank, then broadcast
def test_distributed_two_processes_gloo_stay_in_sync(opt_level):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = [
        subprocess.Popen([sys.executable, "-m", "apexlite", "run", str(EXAMPLES / "distributed_amp.py"),
                          "--steps", "5", "--opt-level", opt_level], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                         cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, err
        assert f"rank {rank}: weights identical on all 2 ranks" in out
    assert len(floats(r"step \d+ loss ([\d.]+)", outputs[0][1])) == 5


def test_long_training_is_cut_by_a_step_budget_and_learns(tmp_path):
    """Written to train for 90 x 2000 steps; APEXLITE_MAX_STEPS ends it cleanly after 8, before its checkpoint."""
    checkpoint = tmp_path / "final.pt"
    result = run_example("long_training_amp.py", "--opt-level", "O2", "--print-freq", "1",
                         "--checkpoint", str(checkpoint), env={"APEXLITE_MAX_STEPS": "8"})
    assert result.returncode == 0, result.stderr
    losses = floats(r"step \d+ loss ([\d.]+)", result.stdout)
    assert len(losses) == 7  # the 8th optimizer.step() ends the run before the script prints it
    assert losses[-1] < 0.9 * losses[0]
    assert "apexlite: run cut at 8 optimizer steps (APEXLITE_MAX_STEPS=8); exiting with status 0" in result.stderr
    assert not checkpoint.exists()
