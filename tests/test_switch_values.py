"""apexlite.switch_values: a bad value switch stops `run` before the script starts, in one line with exit 2, with
the message amp.initialize itself would raise (checked against it); good values let the script run."""
import os
import subprocess
import sys

import pytest

from apexlite.amp.errors import AmpConfigError
from apexlite.switch_values import CHECKS
from apexlite.switches import ON_OFF, SWITCHES

# (switch, a value amp.initialize refuses, words of its message)
BAD = [
    ("APEXLITE_OPT_LEVEL", "O4", "Unexpected optimization level O4"),
    ("APEXLITE_OPT_LEVEL", "01", "the letter O, not the number zero"),
    ("APEXLITE_DTYPE", "fp8", "APEXLITE_DTYPE must be"),
    ("APEXLITE_LOSS_SCALE", "-5", "finite number > 0"),
    ("APEXLITE_LOSS_SCALE", "inf", "finite number > 0"),
    ("APEXLITE_MAX_STEPS", "abc", "whole number >= 1"),
    ("APEXLITE_MAX_STEPS", "0", "whole number >= 1"),
    ("APEXLITE_WARMUP_STEPS", "-1", "whole number >= 0"),
    ("APEXLITE_TELEMETRY", "/nonexistent-apexlite-folder/report.json", "folder that does not exist"),
]
GOOD = {"APEXLITE_OPT_LEVEL": "O2", "APEXLITE_DTYPE": "bfloat16", "APEXLITE_LOSS_SCALE": "dynamic",
        "APEXLITE_MAX_STEPS": "3", "APEXLITE_WARMUP_STEPS": "0"}


def _run(tmp_path, env):
    script = tmp_path / "script.py"
    script.write_text("print('script ran')\n")
    clean = {key: value for key, value in os.environ.items() if not key.startswith("APEXLITE_")}
    return subprocess.run([sys.executable, "-m", "apexlite", "run", str(script)], capture_output=True, text=True,
                          timeout=120, env={**clean, **env})


def test_every_value_switch_read_at_run_time_is_checked_early():
    value_switches = {switch.name for switch in SWITCHES if switch.read_when == "run time"} - set(ON_OFF)
    assert set(CHECKS) == value_switches


@pytest.mark.parametrize("name,value,words", BAD, ids=[f"{name}={value}" for name, value, _ in BAD])
def test_a_bad_value_stops_run_before_the_script_with_amps_own_message(tmp_path, monkeypatch, name, value, words):
    result = _run(tmp_path, {name: value})
    assert result.returncode == 2 and "script ran" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("apexlite run:")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr
    monkeypatch.setenv(name, value)  # the same check amp.initialize makes raises the same message
    with pytest.raises(AmpConfigError) as raised:
        CHECKS[name]()
    assert str(raised.value) in lines[0]


def test_good_values_let_the_script_run(tmp_path):
    result = _run(tmp_path, dict(GOOD, APEXLITE_TELEMETRY=str(tmp_path / "report.json")))
    assert result.returncode == 0 and "script ran" in result.stdout, result.stderr
