"""sweep.gate: the child's side of the rounds protocol, driven here by hand through real pipes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from apexlite.sweep.gate import GATE_ENV, RoundGate


@pytest.fixture
def pipes():
    """(gate, write a command, read the reports written so far)."""
    commands_read, commands_write = os.pipe()
    reports_read, reports_write = os.pipe()
    gate = RoundGate(commands_read, reports_write)
    reader = os.fdopen(reports_read, "r")

    def command(text):
        os.write(commands_write, (text + "\n").encode())

    yield gate, command, reader
    gate.close()
    os.close(commands_write)
    reader.close()


def test_pauses_after_warmup_then_reports_each_slice_after_an_untimed_wake_up_step(pipes):
    gate, command, reports = pipes
    gate.after_step(0.5, timed=False, warmed_up=False)  # still warming up: no pause, nothing reported
    command("2")
    gate.after_step(0.4, timed=False, warmed_up=True)  # warm: reports an empty slice, reads "2"
    assert json.loads(reports.readline()) == {"wall": [], "waited": []}
    gate.after_step(0.9, timed=True, warmed_up=True)  # the first step after a pause wakes up: not timed
    gate.after_step(0.01, timed=True, warmed_up=True)
    command("0")
    gate.after_step(0.02, timed=True, warmed_up=True)  # the slice is full: reported, then "0" lets go
    report = json.loads(reports.readline())
    assert report["wall"] == [0.01, 0.02] and len(report["waited"]) == 2
    if os.path.exists("/proc/thread-self/schedstat"):
        assert all(isinstance(wait, float) and wait >= 0 for wait in report["waited"])
    gate.after_step(0.03, timed=True, warmed_up=True)  # released: runs on without a word
    assert not gate._open


def test_steps_left_out_of_timing_do_not_fill_a_slice(pipes):
    gate, command, reports = pipes
    command("1")
    gate.after_step(0.4, timed=False, warmed_up=True)
    reports.readline()
    command("0")
    gate.after_step(0.9, timed=False, warmed_up=True)  # e.g. the memory-probe step
    gate.after_step(0.5, timed=True, warmed_up=True)  # waking up after the pause
    gate.after_step(0.01, timed=True, warmed_up=True)
    assert json.loads(reports.readline())["wall"] == [0.01]


def test_a_sweep_that_went_away_lets_the_run_go_on(pipes):
    gate, command, reports = pipes
    gate._commands.close()  # nothing will ever answer
    gate.after_step(0.4, timed=False, warmed_up=True)
    assert not gate._open


PROBE = textwrap.dedent("""
    import os, subprocess, sys
    from apexlite.sweep.gate import RoundGate
    gate = RoundGate.from_environment()
    print("paced" if gate is not None else "free", RoundGate.from_environment() is gate)
    if os.fork() == 0:
        print("forked child", "paced" if RoundGate.from_environment() is not None else "free", flush=True)
        os._exit(0)
    os.wait()
    sys.stdout.flush()
    subprocess.run([sys.executable, "-c", "from apexlite.sweep.gate import RoundGate; "
                    "print('grandchild', 'paced' if RoundGate.from_environment() else 'free')"])
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_only_the_process_the_sweep_started_is_paced():
    commands_read, commands_write = os.pipe()
    reports_read, reports_write = os.pipe()
    env = dict(os.environ, **{GATE_ENV: f"{os.getpid()}:{commands_read}:{reports_write}"})
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120,
                            pass_fds=(commands_read, reports_write))
    for descriptor in (commands_read, commands_write, reports_read, reports_write):
        os.close(descriptor)
    assert result.stdout.splitlines() == ["paced True", "forked child free", "grandchild free"], result.stderr
    stranger = subprocess.run([sys.executable, "-c", PROBE.split("if os.fork")[0]], capture_output=True, text=True,
                              env=dict(os.environ, **{GATE_ENV: "1:3:4"}), timeout=120)
    assert stranger.stdout.split() == ["free", "True"]
