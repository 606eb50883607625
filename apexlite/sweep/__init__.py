"""`python -m apexlite sweep`: run an unchanged training script once per opt level and dtype, and decide.

Modules: options (command line); gate (the child's side of the timing rounds) and children (the
sweep's side of one run); rounds (all runs timed round by round); intervals (speed ratios and their
95% intervals); speed (what the rounds say, for the report); verdict (statuses, baseline,
recommendation); report (table, environment, JSON); plot (loss curves); process (the child's
environment, and one unpaced run for `migrate --verify`); cli (the loop tying them).
"""
from typing import List

__all__ = ["main"]


def main(argv: List[str]) -> int:
    """Entry point of `python -m apexlite sweep` (imported on use: amp's telemetry imports sweep.gate)."""
    from apexlite.sweep.cli import main as sweep_main

    return sweep_main(argv)
