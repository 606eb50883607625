"""`apex.amp._amp_state`: the legacy state object and the helpers apex kept next to it."""
from __future__ import annotations

from apexlite._logging import get_logger, is_rank_zero
from apexlite.amp.frontend import master_params  # noqa: F401
from apexlite.amp.legacy_state import LegacyAmpState as AmpState  # noqa: F401
from apexlite.amp.legacy_state import legacy_flags as _amp_state

log = get_logger("amp")


def maybe_print(msg: str, rank0: bool = False) -> None:
    """Log `msg` when amp's verbosity is > 0 (only on rank 0 when `rank0`)."""
    if _amp_state.verbosity > 0 and (not rank0 or is_rank_zero()):
        log.info(msg)


def warn_or_err(msg: str) -> None:
    """Raise RuntimeError(msg), or only warn when `_amp_state.hard_override` is set (apex's switch)."""
    if _amp_state.hard_override:
        log.warning("Warning: %s", msg)
        return
    raise RuntimeError(msg)
