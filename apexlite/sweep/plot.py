"""Loss curves of a sweep by optimizer step (matplotlib, the optional `plot` extra)."""
from __future__ import annotations

import math
from typing import Any, Dict, List

LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "v", "D", "X", "*")  # 7 markers x 4 line styles: 28 distinct runs
MARKS_PER_CURVE = 12
LOG_SCALE_RANGE = 20.0  # a log y axis once the positive losses span more than this factor


def style(index: int, runs: int, points: int) -> Dict[str, Any]:
    """Run `index`'s own line style and marker. Each run marks different steps (index, index + k, ...),
    so runs with identical curves still show every marker."""
    every = max(runs, points // MARKS_PER_CURVE, 1)
    return {"linestyle": LINE_STYLES[index % len(LINE_STYLES)], "marker": MARKERS[index % len(MARKERS)],
            "markevery": (index % every, every), "markersize": 6, "alpha": 0.85}


def _split(curve: List[List[Any]]):
    steps = [point[0] for point in curve]
    losses = [math.nan if point[1] is None else point[1] for point in curve]
    return steps, losses


def write_plot(rows: List[Dict[str, Any]], path: str, title: str) -> None:
    """One curve per row (non-finite losses leave a gap, marked where it starts); skipped steps marked '|'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axis = plt.subplots(figsize=(8, 4.8))
    finite: List[float] = []
    for index, row in enumerate(rows):
        steps, losses = _split(row.get("loss_curve") or [])
        if not steps:
            continue
        name = f"{row['opt_level']} {row['dtype']}"
        drawn = axis.plot(steps, losses, **style(index, len(rows), len(steps)), label=f"{name} ({row['status']})")[0]
        finite += [value for value in losses if not math.isnan(value)]
        skipped = set(row.get("skipped_at") or [])
        marks = [(step, loss) for step, loss in zip(steps, losses) if step in skipped and not math.isnan(loss)]
        if marks:
            axis.plot(*zip(*marks), linestyle="none", marker="|", markersize=16, color=drawn.get_color(),
                      label=f"{name}: skipped step")
        first_bad = next((i for i, loss in enumerate(losses) if math.isnan(loss)), None)
        if first_bad:
            axis.plot([steps[first_bad - 1]], [losses[first_bad - 1]], linestyle="none", marker="x", markersize=12,
                      color="red", label=f"{name}: non-finite after step {steps[first_bad - 1]}")
    if finite and min(finite) > 0 and max(finite) / min(finite) > LOG_SCALE_RANGE:
        axis.set_yscale("log")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("loss seen by amp.scale_loss")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
