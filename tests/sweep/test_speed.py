"""sweep.speed: the speed section names every ratio with its interval, or says why speed was not measured."""
import re

import pytest

from apexlite.sweep.rounds import RoundTimes
from apexlite.sweep.speed import SpeedTable

O0, O1, O2 = ("O0", "float32"), ("O1", "float16"), ("O2", "float16")


def _table(per_pair, rounds=None, disturbed=0, visible=True):
    times = RoundTimes.empty(list(per_pair))
    for pair, values in per_pair.items():
        times.wall[pair] = values
        times.steps[pair] = 10 * len(values)
        times.disturbed[pair] = disturbed
    times.rounds = rounds if rounds is not None else max(len(values) for values in per_pair.values())
    times.stopped, times.waits_visible = "the time budget (60s) was spent", visible
    return SpeedTable(times)


def test_each_ratio_is_printed_with_its_interval_and_verdict():
    table = _table({O0: [1.0e-3] * 8, O1: [2.0e-3, 2.1e-3] * 4, O2: [1.0e-3, 1.02e-3, 0.98e-3, 1.0e-3] * 2})
    lines = table.report_lines(O0, [O0, O1, O2])
    assert lines[0].startswith("speed relative to O0 float32 (median of per-round ratios of step times, 95% "
                               "interval; 8 rounds, ended because the time budget (60s) was spent)")
    assert re.fullmatch(r"  O1 float16  0\.49x \[0\.48, 0\.50\] +slower", lines[1])
    assert re.fullmatch(r"  O2 float16  1\.00x \[0\.98, 1\.02\] +no measurable difference", lines[2])
    assert table.step_time_ms(O1) == 2.05 and table.timed_rounds(O1) == 8
    assert table.step_time_interval_ms(O1) == pytest.approx((2.0, 2.1))  # sign test over 8 rounds: the outermost


def test_a_step_time_has_no_interval_below_six_timed_rounds():
    table = _table({O0: [1.0e-3] * 5 + [None] * 3})
    assert table.timed_rounds(O0) == 5 and table.step_time_interval_ms(O0) is None


def test_nothing_measured_is_one_line_saying_why():
    table = _table({O0: [1.0e-3] * 4, O1: [2.0e-3] * 4})
    assert table.report_lines(O0, [O0, O1]) == [
        "speed could not be measured: at most 4 rounds timed a combination; a 95% interval needs 6 (give more "
        "--max-steps or --budget)."]


def test_steps_that_waited_are_counted_in_the_notes():
    table = _table({O0: [1.0e-3] * 8, O1: [2.0e-3] * 8}, disturbed=3)
    assert table.notes([O0, O1]) == ["timed steps left out because they waited for a CPU (another process was "
                                     "running): O0 float32 3/80, O1 float16 3/80"]
    hidden = _table({O0: [1.0e-3] * 8, O1: [2.0e-3] * 8}, visible=False)
    assert "could not be left out" in hidden.notes([O0, O1])[0]


def test_summary_is_what_the_json_keeps():
    table = _table({O0: [1.0e-3] * 8, O1: [2.0e-3] * 8})
    summary = table.summary(O0, [O0, O1])
    assert summary["baseline"] == "O0 float32" and summary["rounds"] == 8
    assert summary["ratios"] == [{"opt_level": "O1", "dtype": "float16", "estimate": 0.5, "low": 0.5, "high": 0.5,
                                  "rounds": 8, "verdict": "slower"}]


def test_a_pair_without_an_interval_shows_no_ratio():
    table = _table({O0: [1.0e-3] * 8, O1: [2.0e-3] * 8, O2: [1.0e-3, None, None, None, 1.0e-3, None, None, None]})
    lines = table.report_lines(O0, [O0, O1, O2])
    assert lines[2] == "  O2 float16  not measured (2 rounds; 6 give an interval)"
    wide = _table({O0: [1.0e-3] * 8, O1: [2.0e-3] * 8, O2: [1.0e-3, 3.0e-3] * 4})
    assert wide.report_lines(O0, [O0, O1, O2])[2] == (
        "  O2 float16  0.67x [0.33, 1.00]        not measured (interval too wide)")
