"""AmpSession: everything one `initialize` set up, owned in one place and torn down in one call.

The legacy free functions (`amp.scale_loss`, `amp.state_dict`, ...) act on the current session;
`deinitialize()` closes it, undoing every patch. At most one session is current at a time.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Optional

import torch

from apexlite._logging import get_logger, is_rank_zero
from apexlite.amp.cache import CastCache
from apexlite.amp.errors import AmpStateError
from apexlite.amp.opt_levels import Properties
from apexlite.amp.patcher import Patcher
from apexlite.amp.scaler import LossScaler
from apexlite.amp.telemetry import RunStats, telemetry_requested, track_session
from apexlite.amp.wrappers import CastState

log = get_logger("amp")

NOT_INITIALIZED_MESSAGE = (
    "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
    "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called before "
    "`with amp.scale_loss`."
)


class _CurrentSession:
    """Holder of the one active session (the only module-level state of apexlite.amp)."""

    session: Optional["AmpSession"] = None


def current_session(required: bool = True, message: Optional[str] = None) -> Optional["AmpSession"]:
    """The active session; raises AmpStateError with `message` when there is none and one is required."""
    session = _CurrentSession.session
    if session is None and required:
        raise AmpStateError(message or "apexlite.amp is not initialized: call amp.initialize(...) first.")
    return session


class AmpSession:
    """Owns the patcher, cast cache, loss scalers, per-optimizer state and run statistics."""

    def __init__(self, properties: Properties, dtype: torch.dtype, verbosity: int, num_losses: int,
                 min_loss_scale: Optional[float], max_loss_scale: float) -> None:
        self.ensure_none_active()
        self.properties = properties
        self.dtype = dtype
        self.verbosity = verbosity
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = max_loss_scale
        self.patcher = Patcher()
        self.cache = CastCache()
        self.cast_state = CastState(dtype, self.cache, log_casts=verbosity >= 2)
        self.cast_state.enabled = bool(properties.patch_torch_functions)
        self.loss_scalers: List[LossScaler] = [
            LossScaler(properties.loss_scale, min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
            for _ in range(num_losses)
        ]
        self.optimizers: Dict[int, "object"] = {}  # id(optimizer) -> AmpOptimizer
        self.models: List[torch.nn.Module] = []
        self.stats = RunStats(keep_samples=telemetry_requested())
        self.stats.opt_level = properties.opt_level
        self.stats.dtype = str(dtype).replace("torch.", "")
        self.closed = False
        _CurrentSession.session = self
        track_session(self)

    @staticmethod
    def ensure_none_active() -> None:
        """A second `initialize` without `deinitialize` is an error (patches would stack)."""
        if _CurrentSession.session is not None:
            raise AmpStateError(
                "amp.initialize was already called in this process. Call amp.deinitialize() to undo "
                "it (every patch is removed and all amp state reset) before initializing again."
            )

    # --- logging -------------------------------------------------------------------------------
    def info(self, message: str, *args, all_ranks: bool = False) -> None:
        """Log at verbosity >= 1 (rank 0 only unless `all_ranks`)."""
        if self.verbosity >= 1 and (all_ranks or is_rank_zero()):
            log.info(message, *args)

    # --- casting -------------------------------------------------------------------------------
    @property
    def patches_torch(self) -> bool:
        return bool(self.properties.patch_torch_functions)

    @contextlib.contextmanager
    def casts_disabled(self) -> Iterator[None]:
        """Turn O1 casts off for a block; always restores the previous state (nesting-safe)."""
        previous = self.cast_state.enabled
        self.cast_state.enabled = False
        try:
            yield
        finally:
            self.cast_state.enabled = previous

    def release_casts(self) -> None:
        """Drop cached weight casts without ending the iteration (the forward pass is over)."""
        self.cache.clear()

    def end_iteration(self) -> None:
        """Iteration boundary: drop cached weight casts."""
        self.stats.record_casts(self.cache)
        self.cache.clear()

    # --- optimizers ----------------------------------------------------------------------------
    def amp_optimizer(self, optimizer, required: bool = True):
        """The AmpOptimizer for `optimizer` (looked up by identity)."""
        state = self.optimizers.get(id(optimizer))
        if state is None or state.optimizer is not optimizer:
            if not required:
                return None
            raise AmpStateError(
                f"{type(optimizer).__name__} object passed to amp.scale_loss was not passed through "
                "amp.initialize in this session. Pass every optimizer to amp.initialize(models, "
                "optimizers, ...) and use the objects it returns (re-creating an optimizer after "
                "initialize needs amp.deinitialize() and a new initialize)."
            )
        return state

    # --- names apex's handle had; code written against apex calls them --------------------------
    def is_active(self) -> bool:
        return self.cast_state.enabled

    def _clear_cache(self) -> None:
        self.cache.clear()

    def _deactivate(self) -> None:
        self.close()

    # --- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Undo every patch and forget all state. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            for amp_optimizer in list(self.optimizers.values()):
                amp_optimizer.detach()
            self.patcher.undo_all()
        finally:
            self.cache.clear()
            self.optimizers.clear()
            self.models.clear()
            if _CurrentSession.session is self:
                _CurrentSession.session = None
