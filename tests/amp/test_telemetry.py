"""RunStats: the step budget, bounded samples, divergence counting and the tensor-memory measures."""
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from apexlite import amp
from apexlite.amp.bounded_samples import DownsampledCurve, Reservoir
from apexlite.amp.errors import AmpConfigError
from apexlite.amp.session import current_session
from apexlite.amp.telemetry import (
    MAX_STEPS_ENV, NONFINITE_GRACE_STEPS, TELEMETRY_ENV, WARMUP_ENV, RunStats, StepBudgetReached,
)
from apexlite.amp.tensor_memory import StepMemoryProbe, live_cpu_tensor_bytes, state_bytes_per_param

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_telemetry_environment(monkeypatch):
    for name in (MAX_STEPS_ENV, TELEMETRY_ENV, WARMUP_ENV):
        monkeypatch.delenv(name, raising=False)


# --- bounded samples ---------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 2, 7, 100, 4096])
def test_reservoir_is_exact_while_the_stream_fits(count):
    values = [float((i * 7919) % 1000) for i in range(count)]
    reservoir = Reservoir(capacity=4096)
    for value in values:
        reservoir.add(value)
    expected = ((values[0],) * 3 if count == 1 else tuple(statistics.quantiles(values, n=4, method="inclusive")))
    assert reservoir.quartiles() == expected


def test_reservoir_stays_bounded_and_estimates_the_median_of_a_long_stream():
    reservoir = Reservoir(capacity=1000)
    for i in range(200_000):
        reservoir.add(float((i * 7919) % 200_000))  # a permutation of 0..199999: true median 99999.5
    assert len(reservoir.values) == 1000 and reservoir.seen == 200_000
    _, median, _ = reservoir.quartiles()
    assert abs(median - 99_999.5) < 0.05 * 200_000


def test_downsampled_curve_keeps_an_even_spread_of_at_most_capacity_points():
    curve = DownsampledCurve(capacity=64)
    for i in range(30_000):
        curve.add(i)
    points = curve.points
    assert len(points) <= 64 and points[0] == 0
    gaps = {b - a for a, b in zip(points, points[1:])}
    assert gaps == {curve.stride // 2} or gaps == {curve.stride}  # evenly spaced
    assert 30_000 - points[-1] <= curve.stride


def test_downsampled_curve_capacity_must_be_even():
    with pytest.raises(ValueError, match="even"):
        DownsampledCurve(capacity=5)


# --- RunStats ----------------------------------------------------------------------------------
def _feed(stats, losses, skipped=()):
    for index, loss in enumerate(losses, start=1):
        stats.record_loss(torch.tensor(loss))
        stats.record_step(skipped=index in skipped)


def test_each_loss_keeps_the_scale_that_multiplied_it():
    stats = RunStats(keep_samples=True)
    for index, (loss, scale, skipped) in enumerate([(2.0, 65536.0, True), (1.5, 32768.0, False), (1.0, None, False)]):
        stats.record_loss(torch.tensor(loss), scale)
        stats.record_step(skipped=skipped)
    report = stats.report()
    assert report["loss_curve"] == [[1, 2.0], [2, 1.5], [3, 1.0]]
    assert report["loss_scale_curve"] == [[1, 65536.0], [2, 32768.0], [3, None]]
    assert report["skipped_at"] == [1]


def test_memory_stays_bounded_however_long_the_run():
    reports = {}
    for steps in (3_000, 30_000):
        stats = RunStats(keep_samples=True)
        _feed(stats, [1.0 / (i + 1) for i in range(steps)], skipped=set(range(5, steps, 50)))
        assert len(stats.step_times.values) <= stats.step_times.capacity
        assert len(stats.loss_curve.points) < stats.loss_curve.capacity
        assert len(stats.skipped_at.points) < stats.skipped_at.capacity
        reports[steps] = stats.report()
        assert reports[steps]["steps"] == steps and reports[steps]["skipped_steps"] == len(range(5, steps, 50))
    small, large = (len(json.dumps(reports[n])) for n in (3_000, 30_000))
    assert large < 1.5 * small  # ten times the steps, about the same report


def test_warmup_steps_and_the_memory_probe_step_are_not_timed(monkeypatch):
    monkeypatch.setenv(WARMUP_ENV, "4")
    stats = RunStats(keep_samples=True)
    _feed(stats, [1.0] * 10)
    assert stats.warmup_steps == 4 and stats.memory_probe_step == 4
    assert stats.report()["measured_steps"] == 6  # steps 5..10
    monkeypatch.setenv(WARMUP_ENV, "0")
    stats = RunStats(keep_samples=True)
    _feed(stats, [1.0] * 10)
    assert stats.report()["measured_steps"] == 9  # step 2 is profiled for memory, so not timed


def test_nonfinite_losses_count_only_after_the_grace_steps():
    nan = float("nan")
    early = RunStats(keep_samples=True)
    _feed(early, [nan] * NONFINITE_GRACE_STEPS + [1.0] * 10)
    assert early.report()["nonfinite_losses"] == 0 and early.report()["final_loss"] == 1.0
    late = RunStats(keep_samples=True)
    _feed(late, [1.0] * 5 + [nan, float("inf")] + [1.0] * 10)
    report = late.report()
    assert report["nonfinite_losses"] == 2 and report["first_nonfinite_loss_step"] == 6
    assert json.loads(json.dumps(report, allow_nan=False))["loss_curve"][5] == [6, None]


def test_final_loss_is_the_mean_of_the_last_five_and_none_when_one_is_not_finite():
    stats = RunStats(keep_samples=True)
    _feed(stats, [9.0, 8.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    assert stats.report()["final_loss"] == 3.0 and stats.report()["first_loss"] == 9.0
    _feed(stats, [float("nan")])
    assert stats.report()["final_loss"] is None


def test_budget_ends_the_run_after_the_nth_step_skipped_ones_included(monkeypatch, caplog):
    monkeypatch.setenv(MAX_STEPS_ENV, "3")
    stats = RunStats()
    stats.record_step(skipped=False)
    stats.record_step(skipped=True)
    with caplog.at_level("INFO", logger="apexlite.telemetry"):
        with pytest.raises(StepBudgetReached) as stop:
            stats.record_step(skipped=False)
    assert isinstance(stop.value, SystemExit) and stop.value.code == 0
    assert (stats.steps, stats.skipped_steps, stats.cut_at_budget) == (2, 1, True)
    assert [r.getMessage() for r in caplog.records] == [
        "apexlite: run cut at 3 optimizer steps (APEXLITE_MAX_STEPS=3); exiting with status 0"]


@pytest.mark.parametrize("name,value", [(MAX_STEPS_ENV, "0"), (MAX_STEPS_ENV, "ten"), (MAX_STEPS_ENV, "2.5"),
                                        (WARMUP_ENV, "-1")])
def test_bad_environment_values_are_refused_with_the_fix(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(AmpConfigError, match=f"{name} must be a whole number"):
        RunStats()


# path -> what the refusal says (tmp_path substituted for {tmp})
BAD_REPORT_PATHS = {
    "{tmp}": "is a folder; name a file in it",
    "{tmp}/missing/report.json": "is in a folder that does not exist",
}


@pytest.mark.parametrize("path", list(BAD_REPORT_PATHS))
def test_a_report_path_that_cannot_be_written_is_refused_at_initialize(monkeypatch, tmp_path, path):
    """Before anything changes (the write used to fail inside a training step, FileNotFoundError from the first
    flush, with O1's patches in place)."""
    monkeypatch.setenv(TELEMETRY_ENV, path.format(tmp=tmp_path))
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    linear = torch.nn.functional.linear
    try:
        with pytest.raises(AmpConfigError, match=f"{TELEMETRY_ENV}=.* {BAD_REPORT_PATHS[path]}.*Unset it or fix it"):
            amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
        assert current_session(required=False) is None
        assert torch.nn.functional.linear is linear and "step" not in vars(optimizer)
    finally:
        amp.deinitialize()
    assert list(tmp_path.iterdir()) == []  # no .partial file left behind


# --- tensor memory -----------------------------------------------------------------------------
def test_live_tensor_bytes_count_a_new_tensor_and_a_grad_once():
    before = live_cpu_tensor_bytes()
    weight = torch.zeros(1 << 18, requires_grad=True)  # 1 MiB
    view = weight[:10]  # shares the storage: not counted again
    weight.grad = torch.ones(1 << 18)  # another MiB, reachable only through .grad
    assert live_cpu_tensor_bytes() - before == 2 << 20
    del weight, view


def test_live_tensor_bytes_pass_over_the_functional_wrappers_torch_compile_leaves_alive():
    """torch.compile can leave a functional tensor over a fake one alive in the process; its storage refuses
    its address. The count must neither fail on it nor count it (it holds no memory)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(32, 16)
    wrapper = torch._to_functional_tensor(fake)
    with pytest.raises(RuntimeError):
        wrapper.untyped_storage().data_ptr()
    before = live_cpu_tensor_bytes()
    real = torch.zeros(1 << 18)  # 1 MiB
    assert live_cpu_tensor_bytes() - before == 1 << 20
    del real, wrapper, fake


def test_step_probe_reports_live_bytes_plus_the_step_temporaries():
    keep = torch.zeros(1 << 18)  # noqa: F841  (1 MiB live before and after)
    probe = StepMemoryProbe()
    probe.start()
    temporary = torch.ones(1 << 20)  # 4 MiB, freed before the step ends
    del temporary
    probe.stop()
    assert probe.error is None
    assert probe.peak_bytes - live_cpu_tensor_bytes() == 4 << 20


@pytest.mark.parametrize("level,bytes_per_param", [("O0", 16.0), ("O2", 20.0), ("O3", 8.0)])
def test_state_bytes_per_param_after_backward(level, bytes_per_param):
    """Adam: O0 4+4+8; O2 half weights+grads 2+2, fp32 masters+grads 4+4, fp32 state 8; O3 all half."""
    model = torch.nn.Linear(32, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, loss_scale=128.0, verbosity=0)
    try:
        for iteration in range(2):  # the first step creates the optimizer state
            loss = model(torch.randn(4, 32).to(model.weight.dtype)).float().mean()
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            if iteration == 0:
                optimizer.step()
        assert state_bytes_per_param([model], [optimizer]) == bytes_per_param
    finally:
        amp.deinitialize()


# --- the budget in a real run ------------------------------------------------------------------
ENDLESS = textwrap.dedent("""
    import torch
    from apex import amp

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O1", loss_scale=128.0, verbosity=0)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    step = 0
    while True:
        step += 1
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if step == 2:
            loss = loss * float("inf")  # overflows: this step is skipped, and still counts
        opt.zero_grad()
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        print("finished step", step, flush=True)
    print("never reached")
""")


def test_apexlite_run_with_a_step_budget_exits_cleanly_and_reports(tmp_path):
    script, report = tmp_path / "endless.py", tmp_path / "telemetry.json"
    script.write_text(ENDLESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env.update({MAX_STEPS_ENV: "6", TELEMETRY_ENV: str(report)})
    result = subprocess.run([sys.executable, "-m", "apexlite", "run", str(script)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:-1] == [f"finished step {n}" for n in range(1, 6)]  # the 6th step ends it
    cut = [line for line in result.stderr.splitlines() if "run cut at" in line]
    assert cut == ["apexlite: run cut at 6 optimizer steps (APEXLITE_MAX_STEPS=6); exiting with status 0"]
    telemetry = json.loads(report.read_text())
    assert (telemetry["steps"], telemetry["applied_steps"], telemetry["skipped_steps"]) == (6, 5, 1)
    assert telemetry["skipped_at"] == [2] and telemetry["cut_at_budget"] is True


@pytest.mark.parametrize("budget", ["2", "3", None], ids=["budget-inside-the-probe", "budget-at-the-probe", "own-end"])
def test_a_run_ending_inside_the_measured_step_exits_cleanly(tmp_path, budget):
    """The memory probe starts after the step before the measured one; a run that ends there (a script of
    that many steps, or a step budget) used to leave torch's profiler running, which killed the interpreter
    at exit (SIGSEGV). The report says the step was not measured; one more step measures it."""
    script, report = tmp_path / "short.py", tmp_path / "telemetry.json"
    script.write_text(ENDLESS.replace("while True:", "while step < 2:").replace('print("never reached")', ""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APEXLITE_")}
    env[TELEMETRY_ENV] = str(report)
    if budget is not None:
        env[MAX_STEPS_ENV] = budget
        script.write_text(ENDLESS)
    result = subprocess.run([sys.executable, "-m", "apexlite", "run", str(script)], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    measure = json.loads(report.read_text())["peak_tensor_measure"]
    if budget == "3":
        assert measure == "CPU: profiler peak of step 3"
    else:
        assert measure == "not measured: the run ended inside step 3, the one measured"


def test_the_telemetrys_own_bookkeeping_is_left_out_of_the_step_times(monkeypatch):
    """record_loss runs inside the timed step (scale_loss): its own work must not count as the script's, or a
    sweep's speed ratios lean towards 1 on small steps (the reviewer measured 0.04-0.12 ms a step on a CPU)."""
    real_isfinite = torch.isfinite

    def slow_isfinite(value):  # stands in for costly bookkeeping: 30 ms a loss
        time.sleep(0.03)
        return real_isfinite(value)

    stats = RunStats(keep_samples=True)
    monkeypatch.setattr(torch, "isfinite", slow_isfinite)
    for index in range(12):
        stats.record_loss(torch.tensor(1.0))  # at least 30 ms (the sleep), however loaded the machine
        started = time.perf_counter()
        while time.perf_counter() - started < 0.005:  # the script's own step: 5 ms
            pass
        stats.record_step(skipped=False)
    timed = stats.step_times.values
    assert timed and all(0.005 <= value < 0.03 for value in timed), timed
