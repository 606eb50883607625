"""From run records to rows, statuses, a baseline and a recommendation (pure functions, no processes)."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from apexlite.amp.opt_levels import OPT_LEVELS
from apexlite.amp.telemetry import FINAL_LOSS_WINDOW, NONFINITE_GRACE_STEPS
from apexlite.sweep.options import TIE_MARGIN
from apexlite.sweep.speed import SpeedTable

STATUS_ORDER = ("failed", "timeout", "diverged", "stalled", "ok")  # a row takes the first status any repeat had
DIVERGED_LOSS_RATIO = 2.0
# stalled: the baseline's loss fell by at least BASELINE_PROGRESS of its first loss, and this run's by less than
# STALL_FRACTION of that fall (its updates rounded away: fp16/bf16 weights with no masters, an lr below their step)
BASELINE_PROGRESS = 0.02
STALL_FRACTION = 0.25
# telemetry fields whose median over the repeats a row reports
MEDIAN_FIELDS = ("steps", "applied_steps", "skipped_steps", "measured_steps",
                 "peak_tensor_mb", "state_bytes_per_param", "max_rss_mb", "first_loss", "final_loss",
                 "loss_scale", "casts_per_iteration")


def label(row: Dict[str, Any]) -> str:
    return f"{row['opt_level']} {row['dtype']}"


def _nonfinite_reason(telemetry: Dict[str, Any]) -> Optional[str]:
    late = telemetry.get("nonfinite_losses") or 0
    final_bad = bool(telemetry.get("loss_calls")) and telemetry.get("final_loss") is None
    if not late and not final_bad:
        return None
    where = telemetry.get("first_nonfinite_loss_step")
    reason = ("the loss became non-finite" + (f" at step {where}" if where else "")
              + (f" ({late} non-finite losses after step {NONFINITE_GRACE_STEPS})" if late else
                 f" (the last {FINAL_LOSS_WINDOW} losses are not all finite)"))
    traps = telemetry.get("known_traps") or []
    return reason + ("; known trap: " + " ".join(traps) if traps else "")


def classify(record: Dict[str, Any]) -> Dict[str, Any]:
    """An `ok` record whose loss went non-finite becomes `diverged`, with the reason (and known trap)."""
    telemetry = record.get("telemetry")
    if record["status"] == "ok" and telemetry:
        reason = _nonfinite_reason(telemetry)
        if reason:
            record.update(status="diverged", error=reason)
    return record


def _median(values: List[Any]) -> Any:
    present = [value for value in values if value is not None]
    if not present:
        return None
    middle = statistics.median(present)
    return int(middle) if all(isinstance(value, int) for value in present) and middle == int(middle) else middle


def _without_curve(record: Dict[str, Any]) -> Dict[str, Any]:
    """A raw record for the JSON: the row already carries one loss curve."""
    telemetry = {key: value for key, value in (record.get("telemetry") or {}).items() if key != "loss_curve"}
    return {**record, "telemetry": telemetry or None}


def combine(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One row for one combination: medians over its repeats, the worst status, the raw records."""
    status = next(s for s in STATUS_ORDER if any(r["status"] == s for r in records))
    first_with_status = next(r for r in records if r["status"] == status)
    measured = [r["telemetry"] for r in records if r.get("telemetry")]
    row: Dict[str, Any] = {"opt_level": records[0]["opt_level"], "dtype": records[0]["dtype"], "status": status,
                           "error": first_with_status["error"], "repeats": len(records)}
    for field in MEDIAN_FIELDS:
        row[field] = _median([t.get(field) for t in measured])
    # the run's own step timing, which the table does not report (it times the rounds: speed.py)
    row["in_process_step_time_ms"] = _median([t.get("step_time_ms") for t in measured])
    row["in_process_step_time_ms_iqr"] = _median([t.get("step_time_ms_iqr") for t in measured])
    row["in_process_step_time_ms_repeats"] = [t.get("step_time_ms") for t in measured]
    row["wall_time_s"] = _median([r.get("wall_time_s") for r in records])
    first = measured[0] if measured else {}
    row["peak_tensor_measure"] = first.get("peak_tensor_measure")
    row["known_traps"] = list(dict.fromkeys(trap for t in measured for trap in t.get("known_traps", [])))
    row["loss_curve"] = first.get("loss_curve", [])
    row["skipped_at"] = first.get("skipped_at", [])
    row["runs"] = [_without_curve(record) for record in records]
    if status == "timeout" and measured:
        row["error"] += f" (measured {row['steps']} steps before that)"
    return row


def relative_excess(loss: float, baseline: float) -> float:
    """How far `loss` lies above `baseline`, as a fraction of |baseline| (absolute when baseline is 0)."""
    return loss - baseline if baseline == 0 else (loss - baseline) / abs(baseline)


def choose_baseline(rows: List[Dict[str, Any]]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """O0 when it finished with a finite loss; else the first successful run, with a note saying so."""
    usable = [row for row in rows if row["status"] == "ok" and row["final_loss"] is not None]
    o0 = next((row for row in rows if row["opt_level"] == "O0"), None)
    if o0 is not None and o0 in usable:
        return o0, None
    why = "O0 was not part of this sweep" if o0 is None else f"O0 did not finish cleanly ({o0['status']})"
    if not usable:
        return None, f"{why}, and no other run finished with a finite loss"
    return usable[0], f"{why}: losses are compared with {label(usable[0])}, the first successful run"


def apply_baseline(rows: List[Dict[str, Any]], baseline: Optional[Dict[str, Any]]) -> None:
    """Set loss_vs_baseline on every row; an ok row whose final loss is above 2x the baseline's diverged."""
    for row in rows:
        row["loss_vs_baseline"] = None
        if baseline is None or row["final_loss"] is None:
            continue
        base = baseline["final_loss"]
        if base > 0:
            row["loss_vs_baseline"] = row["final_loss"] / base
        if row["status"] == "ok" and relative_excess(row["final_loss"], base) > DIVERGED_LOSS_RATIO - 1:
            traps = row.get("known_traps") or []
            row.update(status="diverged", error=f"final loss {row['final_loss']:.4g} is above "
                                                f"{DIVERGED_LOSS_RATIO:g}x the baseline's ({base:.4g})"
                                                + ("; known trap: " + " ".join(traps) if traps else ""))
        elif row["status"] == "ok" and row is not baseline:
            stall = _stalled(row, baseline)
            if stall:
                row.update(status="stalled", error=stall)


def _stalled(row: Dict[str, Any], baseline: Dict[str, Any]) -> Optional[str]:
    """Why `row` made next to no progress where the baseline made some (see STALL_FRACTION), or None."""
    firsts = (row.get("first_loss"), baseline.get("first_loss"))
    if None in firsts:
        return None
    fell, base_fell = firsts[0] - row["final_loss"], firsts[1] - baseline["final_loss"]
    if base_fell < BASELINE_PROGRESS * abs(firsts[1]) or fell >= STALL_FRACTION * base_fell:
        return None
    return (f"its loss fell {fell:.4g} ({firsts[0]:.4g} -> {row['final_loss']:.4g}) where {label(baseline)}'s fell "
            f"{base_fell:.4g}: its updates may round away (low-precision weights without fp32 masters, or a "
            "learning rate below their resolution)")


def _rank(row: Dict[str, Any], order: List[Tuple[str, str]]) -> Tuple[int, int]:
    pair = (row["opt_level"], row["dtype"])
    return list(OPT_LEVELS).index(row["opt_level"]), order.index(pair) if pair in order else len(order)


def _pair(row: Dict[str, Any]) -> Tuple[str, str]:
    return row["opt_level"], row["dtype"]


def _measurably_faster(speed: SpeedTable, row: Dict[str, Any], than: Dict[str, Any]) -> bool:
    """`row` beat `than`: its whole 95% interval above 1 and the ratio itself at least 1 + TIE_MARGIN."""
    ratio = speed.ratio(_pair(than), _pair(row))
    return ratio.verdict == "faster" and ratio.estimate >= 1 + TIE_MARGIN


def _by_speed(candidates: List[Dict[str, Any]], baseline: Dict[str, Any], speed: SpeedTable,
              order: List[Tuple[str, str]]) -> Tuple[Dict[str, Any], str]:
    """The lowest-ranked candidate no other candidate measurably beat, and why."""
    unbeaten = [row for row in candidates
                if not any(_measurably_faster(speed, other, row) for other in candidates if other is not row)]
    choice = min(unbeaten or candidates, key=lambda row: _rank(row, order))
    step, interval = speed.step_time_ms(_pair(choice)), speed.step_time_interval_ms(_pair(choice))
    reason = f"{label(choice)}: " + (f"{step:.3g} ms/step (95% interval {interval[0]:.3g}-{interval[1]:.3g})"
                                     if interval is not None else "step time not measured")
    if choice is not baseline:
        ratio = speed.ratio(_pair(baseline), _pair(choice))
        reason += (f"; its speed relative to {label(baseline)}: {ratio.text()}" if ratio.low is None else
                   f", {ratio.text()} the speed of {label(baseline)} ({ratio.verdict})")
    others = [label(row) for row in unbeaten if row is not choice]
    if others:
        reason += (f"; {', '.join(others)} not measurably faster (95% interval, and by at least "
                   f"{TIE_MARGIN:.0%}): the lower opt level is preferred")
    return choice, reason


def _by_what_was_measured(candidates: List[Dict[str, Any]], why: str,
                          order: List[Tuple[str, str]]) -> Tuple[Dict[str, Any], str]:
    """Without a speed: the candidate with the least peak tensor memory (then the lower opt level)."""
    def memory(row: Dict[str, Any]) -> float:
        return row["peak_tensor_mb"] if row.get("peak_tensor_mb") is not None else float("inf")

    choice = min(candidates, key=lambda row: (memory(row), _rank(row, order)))
    listed = ", ".join(f"{label(row)} {row['peak_tensor_mb']:.3g} MB" if row.get("peak_tensor_mb") is not None
                       else f"{label(row)} not measured" for row in sorted(candidates, key=memory))
    return choice, (f"speed could not be measured ({why}), so no speed is claimed; ranked by what was "
                    f"measured: finished ok, final loss within tolerance, then least peak tensor memory ({listed})")


def cast_nothing(row: Dict[str, Any]) -> bool:
    """An O1 run that cast no op to low precision ran the script's own precision, not mixed precision."""
    return row["opt_level"] == "O1" and row["status"] == "ok" and row.get("casts_per_iteration") == 0


def precision_notes(rows: List[Dict[str, Any]]) -> List[str]:
    """What the table cannot say by itself: an O1 run that cast nothing measured no low precision."""
    return [f"{label(row)} cast nothing (0 casts per iteration): it ran in the script's own precision, so its "
            f"speed and loss say nothing about {row['dtype']} (a float64 model, or ops outside O1's lists?); "
            "it is not recommended" for row in rows if cast_nothing(row)]


def recommend(rows: List[Dict[str, Any]], baseline: Optional[Dict[str, Any]], note: Optional[str],
              tolerance: float, speed: SpeedTable) -> Dict[str, Any]:
    """The lowest opt level no other run measurably beat in speed, among the ok runs within `tolerance` of
    the baseline's loss; when speed could not be measured, the one with the least memory."""
    def decision(row: Optional[Dict[str, Any]], reason: str) -> Dict[str, Any]:
        reason = f"{note}. {reason}" if note else reason
        return {"opt_level": row["opt_level"] if row else None, "dtype": row["dtype"] if row else None,
                "baseline": label(baseline) if baseline else None, "reason": reason}

    if baseline is None:
        return decision(None, "Nothing to recommend.")
    base_loss = baseline["final_loss"]
    excluded = [f"{label(row)} ({row['status']})" for row in rows if row["status"] != "ok"]
    excluded += [f"{label(row)} (cast nothing)" for row in rows if row["status"] == "ok" and cast_nothing(row)]
    candidates = [row for row in rows if row["status"] == "ok" and row["final_loss"] is not None
                  and relative_excess(row["final_loss"], base_loss) <= tolerance and not cast_nothing(row)]
    left_out = "; not considered: " + ", ".join(excluded) if excluded else ""
    if not candidates:
        return decision(None, f"No run that finished cleanly kept its final loss within {tolerance:.0%} of "
                              f"{label(baseline)}'s{left_out}.")
    order = [_pair(row) for row in rows]
    pairs = [_pair(row) for row in candidates]
    if len(candidates) == 1:
        choice, reason = candidates[0], f"{label(candidates[0])}: the only run that finished ok within tolerance"
    elif any(speed.ratio(a, b).measured for a in pairs for b in pairs if a != b):
        choice, reason = _by_speed(candidates, baseline, speed, order)
    else:
        choice, reason = _by_what_was_measured(candidates, speed.why_not_measured(pairs), order)
    ratio = relative_excess(choice["final_loss"], base_loss)
    reason += (f"; final loss {ratio:+.1%} vs {label(baseline)}'s (tolerance {tolerance:.0%})" if choice is not
               baseline else "; the baseline itself")
    return decision(choice, reason + left_out + ".")
