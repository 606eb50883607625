"""`python -m apexlite sweep`: options, statuses, the recommendation, reports, and real sweeps end to end."""
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apexlite.sweep import options, plot, report, verdict
from tests._helpers.child_process import process_alive

ROOT = Path(__file__).resolve().parents[1]


# --- options -------------------------------------------------------------------------------------
@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def test_script_arguments_go_after_the_double_dash(script):
    args = options.parse_args([script, "--opt-levels", "O1,O2", "--", "--epochs", "1", "--opt-levels", "x"])
    assert args.opt_levels == ["O1", "O2"] and args.script_args == ["--epochs", "1", "--opt-levels", "x"]


@pytest.mark.parametrize("given,expected", [("fp16", ["float16"]), ("half,bf16", ["float16", "bfloat16"]),
                                            ("BF16,bfloat16,float16", ["bfloat16", "float16"])])
def test_dtype_aliases_are_those_apexlite_dtype_accepts(script, given, expected):
    assert options.parse_args([script, "--dtypes", given]).dtypes == expected


BAD_OPTIONS = [
    (["--opt-levels", "01"], "letter O, not zero"),
    (["--dtypes", "float8"], "not among"),
    (["--timeout", "0"], "--timeout: must be a finite number > 0"),
    (["--timeout", "inf"], "--timeout: must be a finite number > 0"),
    (["--max-steps", "0"], "--max-steps: must be a whole number >= 1"),
    (["--max-steps", "2"], "leaves no timed step after --warmup 3"),
    (["--warmup", "-1"], "--warmup: must be a whole number >= 0"),
    (["--repeats", "0"], "--repeats: must be a whole number >= 1"),
    (["--tolerance", "-0.1"], "--tolerance: must be a finite number >= 0"),
    (["--json", "/no/such/dir/runs.json"], "does not exist or is not writable"),
    (["--plot", "curves.gif"], "must end in one of .png, .pdf, .svg"),
    (["--epochs", "3"], "arguments for the script go after `--`"),
]


@pytest.mark.parametrize("extra,message", BAD_OPTIONS, ids=[" ".join(case[0]) for case in BAD_OPTIONS])
def test_bad_options_stop_before_any_run_with_the_reason(script, capsys, extra, message):
    with pytest.raises(SystemExit) as stop:
        options.parse_args([script, *extra])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_script_is_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        options.parse_args([str(tmp_path / "nope.py")])
    assert "no such script" in capsys.readouterr().err


def test_help_documents_every_option_with_its_default_and_the_double_dash(capsys):
    parser = options._build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.option_strings[0] in text
            assert "default" in action.help or action.default is None, action.dest
    assert "-- SCRIPT_ARGS" in text and "sweep train.py --max-steps 20 -- --epochs 90" in text
    assert "APEXLITE_MAX_STEPS=20 python -m apexlite run train.py" in text


def test_o0_runs_once_and_repeats_alternate_their_order():
    pairs = options.combinations(["O0", "O1"], ["float16", "bfloat16"])
    assert pairs == [("O0", "float32"), ("O1", "float16"), ("O1", "bfloat16")]
    assert [pair for _, pair in options.schedule(pairs, 3)] == pairs + pairs[::-1] + pairs


# --- one run's outcome ---------------------------------------------------------------------------
def _telemetry(**fields):
    base = dict(steps=20, applied_steps=20, skipped_steps=0, measured_steps=17, step_time_ms=10.0,
                step_time_ms_iqr=1.0, peak_tensor_mb=5.0, state_bytes_per_param=16.0, max_rss_mb=300.0,
                first_loss=2.0, final_loss=1.0, loss_scale=1.0, casts_per_iteration=0.0, loss_calls=20,
                nonfinite_losses=0, first_nonfinite_loss_step=None, known_traps=[], loss_curve=[[1, 2.0]],
                skipped_at=[], peak_tensor_measure="CPU")
    base.update(fields)
    return base


def _record(level, dtype="float16", status="ok", error=None, **fields):
    return {"opt_level": level, "dtype": dtype, "status": status, "error": error, "exit_code": 0,
            "wall_time_s": 1.0, "telemetry": _telemetry(**fields)}


def test_a_nonfinite_loss_after_the_grace_steps_is_diverged_and_names_the_trap():
    record = verdict.classify(_record("O3", nonfinite_losses=17, first_nonfinite_loss_step=4, final_loss=None,
                                      known_traps=["O3 in float16 with torch.optim.AdamW(eps=1e-08) diverges"]))
    assert record["status"] == "diverged"
    assert record["error"].startswith("the loss became non-finite at step 4 (17 non-finite losses after step 3)")
    assert record["error"].endswith("known trap: O3 in float16 with torch.optim.AdamW(eps=1e-08) diverges")
    assert verdict.classify(_record("O1"))["status"] == "ok"
    assert verdict.classify(_record("O1", status="failed", error="x", final_loss=None))["status"] == "failed"


def test_rows_report_medians_of_repeats_and_the_worst_status():
    records = [_record("O2", step_time_ms=t, final_loss=1.0) for t in (10.0, 14.0, 11.0)]
    row = verdict.combine(records)
    assert (row["status"], row["step_time_ms"], row["steps"], row["repeats"]) == ("ok", 11.0, 20, 3)
    assert row["step_time_ms_repeats"] == [10.0, 14.0, 11.0]
    records[1].update(status="timeout", error="did not finish within 5s")
    assert verdict.combine(records)["status"] == "timeout"
    records[2].update(status="failed", error="exit code 1: ValueError: x")
    row = verdict.combine(records)
    assert row["status"] == "failed" and row["error"] == "exit code 1: ValueError: x"


def _rows(*specs):
    """(level, dtype, status, ms/step, final loss) -> combined rows."""
    return [verdict.combine([_record(level, dtype, status=status, error=None if status == "ok" else status,
                                     step_time_ms=ms, final_loss=loss)])
            for level, dtype, status, ms, loss in specs]


RECOMMENDATIONS = [
    ("fastest within tolerance",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 12.0, 1.01), ("O2", "float16", "ok", 8.0, 1.04)],
     0.05, ("O2", "float16"), ["O2 float16: 8 ms/step (2.50x the speed of O0 float32)", "+4.0%"]),
    ("too lossy is passed over",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 12.0, 1.01), ("O2", "float16", "ok", 8.0, 1.30)],
     0.05, ("O1", "float16"), ["O1 float16: 12 ms/step"]),
    ("a tie goes to the lower level",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 10.2, 1.0), ("O2", "float16", "ok", 10.0, 1.0)],
     0.05, ("O1", "float16"), ["O2 float16 within 5% of the fastest step time: the lower opt level is preferred"]),
    ("diverged and failed are never chosen",
     [("O0", "float32", "ok", 20.0, 1.0), ("O2", "float16", "failed", 1.0, 1.0), ("O3", "float16", "diverged", 1.0,
                                                                                  None)],
     0.05, ("O0", "float32"), ["the baseline itself", "not considered: O2 float16 (failed), O3 float16 (diverged)"]),
    ("without O0 the first successful run is the baseline",
     [("O1", "float16", "failed", 5.0, 1.0), ("O2", "float16", "ok", 9.0, 1.0), ("O3", "bfloat16", "ok", 7.0, 1.02)],
     0.05, ("O3", "bfloat16"), ["O0 was not part of this sweep: losses are compared with O2 float16, the first "
                                "successful run"]),
    ("nothing qualifies",
     [("O0", "float32", "failed", 5.0, 1.0), ("O1", "float16", "diverged", 5.0, None)],
     0.05, (None, None), ["O0 did not finish cleanly (failed), and no other run finished with a finite loss"]),
]


@pytest.mark.parametrize("name,specs,tolerance,choice,phrases", RECOMMENDATIONS, ids=[c[0] for c in RECOMMENDATIONS])
def test_recommendation(name, specs, tolerance, choice, phrases):
    rows = _rows(*specs)
    baseline, note = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    decision = verdict.recommend(rows, baseline, note, tolerance)
    assert (decision["opt_level"], decision["dtype"]) == choice
    for phrase in phrases:
        assert phrase in decision["reason"]


def test_a_final_loss_above_twice_the_baseline_is_diverged():
    rows = _rows(("O0", "float32", "ok", 20.0, 1.0), ("O1", "float16", "ok", 10.0, 2.5),
                 ("O2", "float16", "ok", 10.0, 1.9))
    baseline, _ = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    assert [(row["status"], row["loss_vs_baseline"]) for row in rows] == [("ok", 1.0), ("diverged", 2.5),
                                                                          ("ok", 1.9)]
    assert rows[1]["error"] == "final loss 2.5 is above 2x the baseline's (1)"
    trapped = _rows(("O0", "float32", "ok", 20.0, 1.0), ("O3", "float16", "ok", 10.0, 3.0))
    trapped[1]["known_traps"] = ["O3 in float16 with torch.optim.Adam(eps=1e-08) diverges"]
    verdict.apply_baseline(trapped, trapped[0])
    assert trapped[1]["error"].endswith("; known trap: O3 in float16 with torch.optim.Adam(eps=1e-08) diverges")


# --- reports -------------------------------------------------------------------------------------
def test_json_is_strict_non_finite_values_become_null(tmp_path):
    path = tmp_path / "runs.json"
    report.write_json(str(path), {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "nan"})

    def refuse(token):
        raise AssertionError(f"bare {token} in the JSON")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"a": None, "b": [1.0, None, {"c": None}],
                                                                   "d": "nan"}


@pytest.mark.parametrize("load,iqr,repeats,flagged", [(1.0, 1.0, [10.0], []), (3.5, 1.0, [10.0], ["loaded"]),
                                                      (1.0, 3.0, [10.0], ["spread"]),
                                                      (1.0, 1.0, [9.0, 10.0, 13.0], ["spread"])])
def test_loaded_machine_and_noisy_timings_are_flagged(load, iqr, repeats, flagged):
    row = {"opt_level": "O1", "dtype": "float16", "step_time_ms": 10.0, "step_time_ms_iqr": iqr,
           "step_time_ms_repeats": repeats, "repeats": len(repeats)}
    notes = report.load_notes([row], peak_load=load, cores=2)
    assert ("loaded" in flagged) == any("load average up to" in note for note in notes)
    assert ("spread" in flagged) == any("spread above 20% of the median: O1 float16" in note for note in notes)
    if flagged:  # the advice does not suggest repeats to a sweep that already repeated
        assert notes[-1].endswith("idle machine" if len(repeats) > 1 else "or with --repeats 3")


def test_every_run_gets_its_own_line_style_and_marker():
    styles = {(s["linestyle"], s["marker"]) for s in (plot.style(i, 28, 100) for i in range(28))}
    assert len(styles) == 28


# --- real sweeps ---------------------------------------------------------------------------------
# O2 is clearly fastest (the others sleep 40 ms a step), O3 walks into the Adam eps trap; the loop
# never ends by itself, so the step budget is what stops every run.
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


def test_repeated_sweeps_agree_and_a_diverging_level_fails_the_sweep(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    decisions = []
    for order in ("O0,O2,O3", "O3,O2,O0"):
        out = tmp_path / f"{order}.json"
        result = sweep(str(path), "--opt-levels", order, "--max-steps", "12", "--warmup", "2", "--json", str(out))
        assert result.returncode == 1, result.stdout + result.stderr  # O3 diverged
        document = json.loads(out.read_text(), parse_constant=lambda token: pytest.fail(f"bare {token}"))
        rows = {row["opt_level"]: row for row in document["runs"]}
        assert {level: row["status"] for level, row in rows.items()} == {"O0": "ok", "O2": "ok", "O3": "diverged"}
        assert all(row["steps"] == 12 for row in rows.values())
        assert "torch.optim.Adam(eps=1e-08)" in rows["O3"]["error"] and rows["O3"]["final_loss"] is None
        assert [rows[level]["state_bytes_per_param"] for level in ("O0", "O2", "O3")] == [16.0, 20.0, 8.0]
        assert rows["O0"]["loss_vs_baseline"] == 1.0 and abs(rows["O2"]["loss_vs_baseline"] - 1) < 0.05
        assert set(document["environment"]) >= {"apexlite", "torch", "python", "device", "date", "torch_threads"}
        table = result.stdout[result.stdout.index("level  dtype"):]
        assert any(line.split()[:3] == ["O3", "float16", "diverged"] for line in table.splitlines())
        assert result.stdout.rstrip().splitlines()[-3].startswith("recommendation: ")
        decisions.append((document["recommendation"]["opt_level"], document["recommendation"]["dtype"]))
    assert decisions == [("O2", "float16")] * 2


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
