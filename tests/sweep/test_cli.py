"""`python -m apexlite sweep` end to end: real scripts, real processes, the report and the JSON."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._helpers.child_process import process_alive

ROOT = Path(__file__).resolve().parents[2]


# O2 is clearly fastest (the others sleep 40 ms a step), O3 walks into the Adam eps trap; the loop
# never ends by itself, so the step budget is what stops every run (48 steps: each round takes at least two,
# and an interval needs 6 rounds, some of which a loaded machine spoils).
TOY = textwrap.dedent("""
    import time
    import torch
    from apex import amp

    SLEEP_S = {"O0": 0.04, "O1": 0.04, "O2": 0.0, "O3": 0.04}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    level = amp._amp_state.opt_properties.opt_level
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    while True:
        time.sleep(SLEEP_S[level])
        loss = torch.nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
""")


def sweep(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    return subprocess.run([sys.executable, "-m", "apexlite", "sweep", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
def test_repeated_sweeps_agree_and_a_diverging_level_fails_the_sweep(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    for order in ("O0,O2,O3", "O3,O2,O0"):
        out = tmp_path / f"{order}.json"
        result = sweep(str(path), "--opt-levels", order, "--max-steps", "48", "--warmup", "2", "--json", str(out))
        assert result.returncode == 1, result.stdout + result.stderr  # O3 diverged
        document = json.loads(out.read_text(), parse_constant=lambda token: pytest.fail(f"bare {token}"))
        rows = {row["opt_level"]: row for row in document["runs"]}
        assert {level: row["status"] for level, row in rows.items()} == {"O0": "ok", "O2": "ok", "O3": "diverged"}
        assert all(row["steps"] == 48 for row in rows.values())
        assert "torch.optim.Adam(eps=1e-08)" in rows["O3"]["error"] and rows["O3"]["final_loss"] is None
        assert [rows[level]["state_bytes_per_param"] for level in ("O0", "O2", "O3")] == [16.0, 20.0, 8.0]
        assert rows["O0"]["loss_vs_baseline"] == 1.0 and abs(rows["O2"]["loss_vs_baseline"] - 1) < 0.05
        assert set(document["environment"]) >= {"apexlite", "torch", "python", "device", "date", "torch_threads"}
        table = result.stdout[result.stdout.index("level  dtype"):]
        assert any(line.split()[:3] == ["O3", "float16", "diverged"] for line in table.splitlines())
        assert result.stdout.rstrip().splitlines()[-3].startswith("recommendation: ")
        speed = document["speed"]
        assert speed["baseline"] == "O0 float32" and speed["rounds"] >= 1
        verdicts = {r["opt_level"]: r["verdict"] for r in speed["ratios"]}
        assert set(verdicts) <= {"O2", "O3"} and verdicts.get("O2") in ("faster", "not measured")  # O3 sleeps as O0
        why = document["recommendation"]["reason"]
        claim = re.search(r"\d\.\d\dx \[\d+\.\d\d, \d+\.\d\d\] the speed of O0", why)
        assert claim or "speed could not be measured" in why
        # measured, O2 wins on speed; unmeasured (a loaded machine spoilt the rounds), no speed is claimed and
        # the least memory wins: O0
        expected = ("O2", "float16") if claim else ("O0", "float32")
        assert (document["recommendation"]["opt_level"], document["recommendation"]["dtype"]) == expected, why


HANGS_OR_FAILS = textwrap.dedent("""
    import subprocess, sys, time
    import torch
    from apex import amp

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O1", loss_scale=128.0, verbosity=0)
    for _ in range(5):
        with amp.scale_loss(model(torch.randn(8, 4)).float().pow(2).mean(), opt) as scaled:
            scaled.backward()
        opt.step()
    sys.stderr.write("UserWarning: unrelated noise on stderr\\n")
    if amp._amp_state.opt_properties.opt_level == "O1":
        raise ValueError("bad batch shape (8, 3)")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(sys.argv[1], "w") as handle:
        handle.write(str(child.pid))
    time.sleep(300)
""")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_failed_run_shows_its_exception_and_a_timeout_kills_the_tree_but_keeps_its_steps(tmp_path):
    path, pid_file, out = tmp_path / "hang.py", tmp_path / "child.pid", tmp_path / "runs.json"
    path.write_text(HANGS_OR_FAILS)
    result = sweep(str(path), "--opt-levels", "O1,O2", "--timeout", "10", "--json", str(out), "--", str(pid_file))
    assert result.returncode == 1
    rows = {row["opt_level"]: row for row in json.loads(out.read_text())["runs"]}
    assert rows["O1"]["status"] == "failed" and rows["O1"]["error"] == "exit code 1: ValueError: bad batch shape (8, 3)"
    assert rows["O2"]["status"] == "timeout" and rows["O2"]["steps"] == 5  # written on SIGTERM
    assert "measured 5 steps before that" in rows["O2"]["error"]
    assert not process_alive(int(pid_file.read_text()))  # the script's own child went with it
    assert "O1 float16 failed: exit code 1: ValueError: bad batch shape (8, 3)" in result.stdout


def test_long_legacy_example_under_a_budget_with_a_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the optional 'plot' extra) is not installed")
    png = tmp_path / "loss.png"
    result = sweep("examples/long_training_amp.py", "--opt-levels", "O0,O2", "--dtypes", "bf16", "--max-steps", "6",
                   "--plot", str(png))
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout[result.stdout.index("level  dtype"):].splitlines()
    assert [line.split()[:4] for line in table[2:4]] == [["O0", "float32", "ok", "6"], ["O2", "bfloat16", "ok", "6"]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# amp.initialize(..., enabled=use_amp), the usual `--fp16` switch, left off
AMP_SWITCHED_OFF = textwrap.dedent("""
    import sys
    import torch
    from apex import amp

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", enabled="--amp" in sys.argv, verbosity=0)
    for _ in range(12):
        loss = model(torch.randn(8, 8)).square().mean()
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
""")


def test_a_script_that_leaves_amp_off_fails_every_run_saying_how_to_turn_it_on(tmp_path):
    path, out = tmp_path / "switch.py", tmp_path / "runs.json"
    path.write_text(AMP_SWITCHED_OFF)
    result = sweep(str(path), "--opt-levels", "O0,O1", "--dtypes", "bf16", "--max-steps", "6", "--json", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    rows = json.loads(out.read_text())["runs"]
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert all("enabled=False), so amp was off: pass the script's own switch" in row["error"] for row in rows)
    turned_on = sweep(str(path), "--opt-levels", "O0,O1", "--dtypes", "bf16", "--max-steps", "6", "--json", str(out),
                      "--", "--amp")
    assert turned_on.returncode == 0, turned_on.stdout + turned_on.stderr
    assert [row["status"] for row in json.loads(out.read_text())["runs"]] == ["ok", "ok"]
