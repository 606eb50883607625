"""sweep.verdict: statuses, rows, the baseline and the recommendation (pure functions on records)."""
import random
import re

import pytest

from apexlite.sweep import verdict
from apexlite.sweep.rounds import RoundTimes
from apexlite.sweep.speed import SpeedTable


def _telemetry(**fields):
    base = dict(steps=20, applied_steps=20, skipped_steps=0, measured_steps=17, step_time_ms=10.0,
                step_time_ms_iqr=1.0, peak_tensor_mb=5.0, state_bytes_per_param=16.0, max_rss_mb=300.0,
                first_loss=10.0, final_loss=1.0, loss_scale=1.0, casts_per_iteration=4.0, loss_calls=20,
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
    assert (row["status"], row["in_process_step_time_ms"], row["steps"], row["repeats"]) == ("ok", 11.0, 20, 3)
    assert "step_time_ms" not in row  # the table's step time comes from the rounds (speed.py), set beside it
    records[1].update(status="timeout", error="did not finish within 5s")
    assert verdict.combine(records)["status"] == "timeout"
    records[2].update(status="failed", error="exit code 1: ValueError: x")
    row = verdict.combine(records)
    assert row["status"] == "failed" and row["error"] == "exit code 1: ValueError: x"


def _rows(*specs):
    """(level, dtype, status, ms/step, final loss[, peak MB]) -> combined rows."""
    return [verdict.combine([_record(spec[0], spec[1], status=spec[2], error=None if spec[2] == "ok" else spec[2],
                                     step_time_ms=spec[3], final_loss=spec[4],
                                     peak_tensor_mb=spec[5] if len(spec) > 5 else 5.0)])
            for spec in specs]


def _speed(specs, rounds=12, jitter=0.01, disturbed=0):
    """Per-round step times around each spec's ms/step (seeded jitter), as the rounds would record them."""
    rng = random.Random(0)
    pairs = [(spec[0], spec[1]) for spec in specs]
    times = RoundTimes.empty(pairs)
    for spec, pair in zip(specs, pairs):
        times.wall[pair] = [spec[3] * 1e-3 * rng.gauss(1.0, jitter) for _ in range(rounds)]
        times.steps[pair], times.disturbed[pair] = 10 * rounds, disturbed * rounds
    times.rounds, times.stopped = rounds, "the time budget (60s) was spent"
    return SpeedTable(times)


def _decide(specs, tolerance=0.05, **speed):
    rows = _rows(*specs)
    baseline, note = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    return verdict.recommend(rows, baseline, note, tolerance, _speed(specs, **speed))


RECOMMENDATIONS = [
    ("measurably fastest within tolerance",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 12.0, 1.01), ("O2", "float16", "ok", 8.0, 1.04)],
     {}, ("O2", "float16"),
     [r"O2 float16: (7\.9\d|8\.0\d?) ms/step \(95% interval [\d.]+-[\d.]+\), "
      r"2\.\d\dx \[2\.\d\d, 2\.\d\d\] the speed of O0 float32 \(faster\)",
      r"\+4\.0%"]),
    ("too lossy is passed over",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 12.0, 1.01), ("O2", "float16", "ok", 8.0, 1.30)],
     {}, ("O1", "float16"), [r"O1 float16: 1[12]\.\d ms/step \(95% interval [\d.]+-[\d.]+\), "
                                 r"1\.6\dx \[1\.\d\d, 1\.\d\d\] the speed of O0 float32"]),
    ("measurably but barely faster is a tie: the lower level",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 10.2, 1.0), ("O2", "float16", "ok", 10.0, 1.0)],
     {"jitter": 0.002}, ("O1", "float16"),
     ["O2 float16 not measurably faster (95% interval, and by at least 5%): the lower opt level is preferred"]),
    ("overlapping intervals: no measurable difference, the lower level",
     [("O0", "float32", "ok", 20.0, 1.00), ("O1", "float16", "ok", 10.0, 1.0), ("O2", "float16", "ok", 9.5, 1.0)],
     {"jitter": 0.08, "rounds": 20}, ("O1", "float16"), ["O2 float16 not measurably faster"]),
    ("the toy on a quiet CPU: O0",
     [("O0", "float32", "ok", 0.59, 1.0), ("O1", "float16", "ok", 2.0, 1.0), ("O2", "float16", "ok", 1.8, 1.0)],
     {}, ("O0", "float32"), [r"O0 float32: 0\.5\d+ ms/step \(95% interval [\d.]+-[\d.]+\); the baseline itself"]),
    ("diverged and failed are never chosen",
     [("O0", "float32", "ok", 20.0, 1.0), ("O2", "float16", "failed", 1.0, 1.0), ("O3", "float16", "diverged", 1.0,
                                                                                  None)],
     {}, ("O0", "float32"), ["the only run that finished ok", "the baseline itself",
                             "not considered: O2 float16 (failed), O3 float16 (diverged)"]),
    ("without O0 the first successful run is the baseline",
     [("O1", "float16", "failed", 5.0, 1.0), ("O2", "float16", "ok", 9.0, 1.0), ("O3", "bfloat16", "ok", 7.0, 1.02)],
     {}, ("O3", "bfloat16"), ["O0 was not part of this sweep: losses are compared with O2 float16, the first "
                              "successful run"]),
    ("nothing qualifies",
     [("O0", "float32", "failed", 5.0, 1.0), ("O1", "float16", "diverged", 5.0, None)],
     {}, (None, None), ["O0 did not finish cleanly (failed), and no other run finished with a finite loss"]),
    ("too few rounds: ranked by memory, no speed claimed",
     [("O0", "float32", "ok", 20.0, 1.0, 5.7), ("O1", "float16", "ok", 5.0, 1.0, 4.3),
      ("O2", "float16", "ok", 50.0, 1.0, 4.1)],
     {"rounds": 4}, ("O2", "float16"),
     ["speed could not be measured (at most 4 rounds timed a combination; a 95% interval needs 6",
      "no speed is claimed", "least peak tensor memory (O2 float16 4.1 MB, O1 float16 4.3 MB, O0 float32 5.7 MB)"]),
    ("most steps waited for a CPU: ranked by memory",
     [("O0", "float32", "ok", 20.0, 1.0, 5.7), ("O1", "float16", "ok", 5.0, 1.0, 4.3)],
     {"rounds": 3, "disturbed": 9}, ("O1", "float16"),
     ["90% of the timed steps waited for a CPU", "no speed is claimed"]),
    ("noise too large for any interval: ranked by memory",
     [("O0", "float32", "ok", 20.0, 1.0, 5.7), ("O1", "float16", "ok", 5.0, 1.0, 4.3)],
     {"jitter": 0.6, "rounds": 8}, ("O1", "float16"),
     ["the round-to-round spread was too large", "no speed is claimed"]),
]


@pytest.mark.parametrize("name,specs,speed,choice,phrases", RECOMMENDATIONS, ids=[c[0] for c in RECOMMENDATIONS])
def test_recommendation(name, specs, speed, choice, phrases):
    decision = _decide(specs, **speed)
    assert (decision["opt_level"], decision["dtype"]) == choice, decision["reason"]
    for phrase in phrases:
        assert phrase in decision["reason"] or re.search(phrase, decision["reason"]), (phrase, decision["reason"])


def test_every_speed_in_a_reason_comes_with_its_interval():
    for _, specs, speed, _, _ in RECOMMENDATIONS:
        reason = _decide(specs, **speed)["reason"]
        for claim in re.findall(r"\d+\.\d+x(?: \[[^]]*\])?", reason):
            assert re.fullmatch(r"\d+\.\d+x \[\d+\.\d+, \d+\.\d+\]", claim), (claim, reason)


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




def test_an_o1_run_that_cast_nothing_is_noted_and_never_recommended():
    """A float64 script at O1 casts nothing (O1 leaves float64 alone): its row measured no low precision, so the
    sweep must not recommend it as fast mixed precision, and says why."""
    specs = [("O0", "float32", "ok", 20.0, 1.0), ("O1", "float16", "ok", 10.0, 1.0)]
    rows = [verdict.combine([_record("O0", "float32", step_time_ms=20.0, casts_per_iteration=0.0)]),
            verdict.combine([_record("O1", "float16", step_time_ms=10.0, casts_per_iteration=0.0)])]
    baseline, note = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    choice = verdict.recommend(rows, baseline, note, 0.05, _speed(specs))
    assert (choice["opt_level"], choice["dtype"]) == ("O0", "float32")
    assert "not considered: O1 float16 (cast nothing)" in choice["reason"]
    assert verdict.precision_notes(rows) == [
        "O1 float16 cast nothing (0 casts per iteration): it ran in the script's own precision, so its speed and "
        "loss say nothing about float16 (a float64 model, or ops outside O1's lists?); it is not recommended"]
    casting = [verdict.combine([_record("O1", "float16", step_time_ms=10.0, casts_per_iteration=4.0)])]
    assert verdict.precision_notes(casting) == []


@pytest.mark.parametrize("first,final,status", [
    (21.271221, 21.271221, "stalled"),  # O3 bf16 with lr 1e-5: every update rounded away (the loss never moved)
    (21.3, 21.2, "stalled"),  # fell under a quarter of the baseline's fall
    (21.3, 21.1, "ok"),  # a quarter or more
    (21.3, 20.0, "ok"),
])
def test_a_run_whose_loss_barely_fell_where_the_baselines_did_is_stalled_and_never_recommended(first, final, status):
    """The reviewer's sweep: O0 fell from 21.30 to 20.55 over 300 steps; O3 bf16's loss stayed 21.271221, within the
    5% tolerance of O0's final loss, and was recommended for its memory. A run that did not train is not ok."""
    records = [_record("O0", "float32", first_loss=21.3, final_loss=20.55, step_time_ms=20.0, peak_tensor_mb=0.195),
               _record("O3", "bfloat16", first_loss=first, final_loss=final, step_time_ms=20.0, peak_tensor_mb=0.191)]
    rows = [verdict.combine([record]) for record in records]
    baseline, _ = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    assert rows[1]["status"] == status
    if status == "stalled":
        assert "its loss fell" in rows[1]["error"] and "O0 float32's fell 0.75" in rows[1]["error"]
        decided = verdict.recommend(rows, baseline, None, 0.05, _speed([("O0", "float32", "ok", 20.0, 20.55),
                                                                          ("O3", "bfloat16", "ok", 20.0, 21.2)]))
        assert (decided["opt_level"], decided["dtype"]) == ("O0", "float32")
        assert "not considered: O3 bfloat16 (stalled)" in decided["reason"]


def test_no_stall_is_called_where_the_baseline_itself_made_no_progress():
    """A loss that does not fall under fp32 either (a converged fine-tune, noise) says nothing about the others."""
    rows = _rows(("O0", "float32", "ok", 20.0, 9.9), ("O3", "bfloat16", "ok", 20.0, 10.0))
    baseline, _ = verdict.choose_baseline(rows)
    verdict.apply_baseline(rows, baseline)
    assert [row["status"] for row in rows] == ["ok", "ok"]
