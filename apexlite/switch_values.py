"""The value switches (APEXLITE_OPT_LEVEL, _DTYPE, _LOSS_SCALE, _MAX_STEPS, _WARMUP_STEPS, _TELEMETRY) checked
before a command starts, by the same parsers amp runs at amp.initialize: a typo then stops the command in one
line, with the fix, instead of failing with a traceback after the script's setup (minutes of data loading)."""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List


def _opt_level() -> None:
    from apexlite.amp.environment import OPT_LEVEL_ENV
    from apexlite.amp.errors import AmpConfigError
    from apexlite.amp.opt_levels import OPT_LEVELS, unknown_opt_level_message

    level = os.environ[OPT_LEVEL_ENV]
    if level not in OPT_LEVELS:
        raise AmpConfigError(f"{OPT_LEVEL_ENV}: " + unknown_opt_level_message(level))


def _dtype() -> None:
    from apexlite.amp.environment import DTYPE_ENV, parse_dtype

    parse_dtype(os.environ[DTYPE_ENV], DTYPE_ENV)


def _loss_scale() -> None:
    from apexlite.amp.environment import loss_scale_from_environment

    loss_scale_from_environment(None)


def _count(name: str, minimum: int) -> Callable[[], None]:
    def check() -> None:
        from apexlite.amp.telemetry import env_count

        env_count(name, minimum)

    return check


def _telemetry() -> None:
    from apexlite.amp.telemetry_writer import check_report_path

    check_report_path()


CHECKS: Dict[str, Callable[[], None]] = {
    "APEXLITE_OPT_LEVEL": _opt_level, "APEXLITE_DTYPE": _dtype, "APEXLITE_LOSS_SCALE": _loss_scale,
    "APEXLITE_MAX_STEPS": _count("APEXLITE_MAX_STEPS", 1), "APEXLITE_WARMUP_STEPS": _count("APEXLITE_WARMUP_STEPS", 0),
    "APEXLITE_TELEMETRY": _telemetry,
}


def refused_values(names: Iterable[str]) -> List[str]:
    """Why each of `names` that is set in this process's environment holds a value amp would refuse."""
    refused = []
    for name in names:
        if name in CHECKS and os.environ.get(name, "").strip():
            try:
                CHECKS[name]()
            except (ValueError, TypeError, RuntimeError, OSError) as error:
                refused.append(str(error))
    return refused
