"""sweep.plot: every run's curve is told apart by line style and marker."""
from apexlite.sweep import plot


def test_every_run_gets_its_own_line_style_and_marker():
    styles = {(s["linestyle"], s["marker"]) for s in (plot.style(i, 28, 100) for i in range(28))}
    assert len(styles) == 28
