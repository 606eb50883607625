"""`python -m apexlite sweep`: one fresh process per combination, table, JSON schema, PNG, failures isolated."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite import sweep

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from apex import amp

    steps = int(sys.argv[1])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    if amp._amp_state.opt_properties.opt_level == "O3":
        raise RuntimeError("this model diverges in pure fp16")
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
""")


def test_sweep_end_to_end_json_table_plot_and_failure(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the optional 'plot' extra) is not installed")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out_json, out_png = tmp_path / "runs.json", tmp_path / "loss.png"
    result = subprocess.run(
        [sys.executable, "-m", "apexlite", "sweep", str(script), "--opt-levels", "O2,O3", "--dtypes", "bfloat16",
         "--json", str(out_json), "--plot", str(out_png), "--", "6"],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 1, result.stderr  # one combination failed
    assert "[1/2] O2 bfloat16 ... ok" in result.stdout and "[2/2] O3 bfloat16 ... failed" in result.stdout
    assert "O3 bfloat16: exit code 1: RuntimeError: this model diverges in pure fp16" in result.stdout
    runs = json.loads(out_json.read_text())["runs"]
    assert [(r["opt_level"], r["dtype"], r["status"]) for r in runs] == [("O2", "bfloat16", "ok"),
                                                                         ("O3", "bfloat16", "failed")]
    ok = runs[0]
    for key in ("steps", "step_time_ms", "peak_memory_mb", "first_loss", "final_loss", "skipped_steps",
                "loss_scale", "casts_per_iteration"):
        assert key in ok and ok[key] is not None, key
    assert ok["steps"] == 6 and ok["skipped_steps"] == 0 and len(ok["losses"]) == 6
    assert ok["loss_scale"] == 1.0  # bf16 needs no loss scaling
    assert ok["final_loss"] < ok["first_loss"]
    assert runs[1]["error"].startswith("exit code 1")
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = result.stdout.splitlines()[result.stdout.splitlines().index("") + 1]
    assert header.split()[:3] == ["level", "dtype", "status"]


def test_combinations_run_o0_once():
    assert sweep.combinations(["O0", "O1"], ["float16", "bfloat16"]) == [
        ("O0", "float32"), ("O1", "float16"), ("O1", "bfloat16")]


def test_argument_validation_and_script_args():
    args = sweep.parse_args(["t.py", "--opt-levels", "O1,O2", "--", "--epochs", "1"])
    assert args.opt_levels == ["O1", "O2"] and args.script_args == ["--epochs", "1"]
    with pytest.raises(SystemExit):
        sweep.parse_args(["t.py", "--opt-levels", "01"])  # digit zero, not the letter O
    with pytest.raises(SystemExit):
        sweep.parse_args(["t.py", "--dtypes", "float8"])


def test_table_shows_failures_with_their_error():
    runs = [dict(opt_level="O1", dtype="float16", status="ok", error=None, steps=3, skipped_steps=1,
                 step_time_ms=1.5, peak_memory_mb=10.0, first_loss=2.0, final_loss=1.0, loss_scale=32768.0,
                 casts_per_iteration=4.0),
            dict(opt_level="O3", dtype="float16", status="timeout", error="did not finish within 5s")]
    table = sweep.format_table(runs).splitlines()
    assert table[2].split() == ["O1", "float16", "ok", "3", "1", "1.5", "10", "2", "1", "3.277e+04", "4"]
    assert table[3].split()[:3] == ["O3", "float16", "timeout"] and table[3].split()[3] == "-"
    assert table[-1] == "O3 float16: did not finish within 5s"


def test_missing_script_is_an_error(tmp_path, capsys):
    assert sweep.main([str(tmp_path / "nope.py")]) == 2
    assert "no such script" in capsys.readouterr().err
