"""The environment of a user's shell for install tests: this process's, without apexlite's own switches.

The suite itself may run with them set (CI's APEXLITE_REQUIRE_EXTENSION=1, the pure-Python run's
APEXLITE_DISABLE_EXTENSION=1); an install test that inherited them would measure CI's or the Python
path's install instead of the one a user gets.
"""
from __future__ import annotations

import os
from typing import Dict

QUIET_TORCH = "ignore:Failed to initialize NumPy"  # PYTHONWARNINGS for torch's own note about a venv without numpy


def user_environment(**extra: str) -> Dict[str, str]:
    """os.environ minus every APEXLITE_* variable, plus `extra`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("APEXLITE_")}
    env.update(extra)
    return env
