"""`python -m apexlite sweep`: run an unchanged training script once per opt level and dtype, and decide.

Modules: options (command line), process (one run in a fresh process), verdict (statuses, baseline,
recommendation), report (table, environment, JSON), plot (loss curves), cli (the loop tying them).
"""
from apexlite.sweep.cli import main

__all__ = ["main"]
