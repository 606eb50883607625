"""`amp._amp_state`: the legacy global some code reads and writes, backed by the current session.

Only two things live here rather than in a session: the user flags apex kept in `_amp_state`
(`allow_incoming_model_not_fp32`, `hard_override`), which code sets before `initialize`.
"""
from __future__ import annotations

from typing import Any


class LegacyAmpState:
    """Attribute-compatible stand-in for apex's `_amp_state`."""

    def __init__(self) -> None:
        self.allow_incoming_model_not_fp32 = False
        self.hard_override = False

    @staticmethod
    def _session() -> Any:
        from apexlite.amp.session import current_session

        return current_session(required=False)

    @property
    def opt_properties(self) -> Any:
        session = self._session()
        if session is None:
            raise AttributeError("opt_properties: amp.initialize has not been called")
        return session.properties

    @property
    def loss_scalers(self) -> Any:
        session = self._session()
        if session is None:
            raise AttributeError("loss_scalers: amp.initialize has not been called")
        return session.loss_scalers

    @property
    def verbosity(self) -> int:
        session = self._session()
        return 1 if session is None else session.verbosity

    @property
    def handle(self) -> Any:
        session = self._session()
        if session is None or session.handle is None:
            raise AttributeError("handle: only an O1 session (amp.initialize(opt_level='O1') or amp.init()) has one")
        return session.handle


legacy_flags = LegacyAmpState()
