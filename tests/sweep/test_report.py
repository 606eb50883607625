"""sweep.report: strict JSON, the load note, and the table's columns."""
import json
import math

import pytest

from apexlite.sweep import report


def test_json_is_strict_non_finite_values_become_null(tmp_path):
    path = tmp_path / "runs.json"
    report.write_json(str(path), {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "nan"})

    def refuse(token):
        raise AssertionError(f"bare {token} in the JSON")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"a": None, "b": [1.0, None, {"c": None}],
                                                                   "d": "nan"}


@pytest.mark.parametrize("load,cores,noted", [(1.0, 2, False), (2.0, 2, False), (3.5, 2, True)])
def test_a_load_above_the_core_count_is_noted(load, cores, noted):
    notes = report.load_notes(load, cores)
    assert bool(notes) is noted
    if noted:
        assert notes == [f"the machine was loaded: load average up to {load:.2f} on {cores} cores"]


def test_table_has_a_column_and_a_legend_line_per_measure():
    row = {key: None for key, _, _ in report.COLUMNS}
    row.update(opt_level="O1", dtype="float16", status="ok", steps=20, step_time_ms=1.23456,
               step_time_ms_95=[1.2, 1.25], timed_rounds=9)
    lines = report.format_table([row]).splitlines()
    assert lines[0].split()[:8] == ["level", "dtype", "status", "steps", "skipped", "ms/step", "interval", "rounds"]
    assert lines[2].split()[:8] == ["O1", "float16", "ok", "20", "-", "1.235", "1.2-1.25", "9"]
    assert len(report.legend().splitlines()) == sum(1 for _, _, meaning in report.COLUMNS if meaning)
