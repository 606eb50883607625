"""AmpSession: everything `initialize` (and the old `amp.init`) set up, owned in one place.

NOTE [one session per process, extended by later initialize calls]
apex allowed `amp.initialize` to be called again without teardown (scripts loop over opt levels,
restore a checkpoint into a fresh model beside the running one, re-initialize per test), and its
loss scalers were process-global. apexlite keeps one session per process and lets each call extend
it: the latest call's options apply (opt level, dtype, verbosity), the loss scalers are replaced by
fresh ones that every registered optimizer then shares (as in apex), new models and optimizers join
the ones registered before, and O1's torch patches are installed once, never stacked. Passing an
optimizer (or an O2/O3-cast model) a second time stays an error. `deinitialize()` undoes everything.
Registered models and optimizers are held weakly (weak_registry.py, and o1/patcher.py's NOTE
[patches never keep a model or optimizer alive]): one the program drops is freed and leaves the
session, so neither memory nor the cost of a later `initialize` grows with the calls made before.

NOTE [forward scope]
Under O1 the end of a registered model's outermost forward drops the cast cache (cache.py's NOTE
[cast cache lifetime]). The scope is kept per thread as the frame of the outermost forward's
`Module._call_impl`, not as a depth count: torch runs forward hooks on the way out only for an
`Exception`, so a KeyboardInterrupt, SystemExit or GeneratorExit passing through a forward skips the
end hook. A count would then stay raised for good and no later forward would drop the cache; a frame
is checked instead: when a registered forward starts and the recorded frame is no longer on the
thread's stack, that forward was interrupted, its scope is over (the cache is dropped) and the new
forward is the outermost one. The recorded frame is held only while its scope is open or until that
check (the next registered forward, `scale_loss` or the session's end) finds it interrupted.
"""
from __future__ import annotations

import sys
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, Optional

import torch

from apexlite._logging import get_logger, is_rank_zero
from apexlite.amp.model_loads import ModelLoads
from apexlite.amp.o1.cache import tracing
from apexlite.amp.o1.native_casts import make_cache_and_state
from apexlite.amp.errors import AmpStateError
from apexlite.amp.opt_levels import Properties
from apexlite.amp.o1.patcher import Patcher
from apexlite.amp.scaler import LossScaler, OverflowSync
from apexlite.amp.telemetry import RunStats
from apexlite.amp.telemetry_writer import telemetry_requested, track_session
from apexlite.amp.weak_registry import WeakOrderedSet

log = get_logger("amp")

NOT_INITIALIZED_MESSAGE = (
    "Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
    "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called before "
    "`with amp.scale_loss`."
)
DEFAULT_MAX_NONFINITE_LOSSES = 200


class _Process:
    """Process-wide holders: the current session, and the overflow agreement plugged in by the
    distributed layer (apexlite.parallel.overflow); the only module-level state of apexlite.amp."""

    session: Optional["AmpSession"] = None
    overflow_agreement: Optional[Callable[[], Optional[OverflowSync]]] = None


def current_session(required: bool = True, message: Optional[str] = None) -> Optional["AmpSession"]:
    """The active session; raises AmpStateError with `message` when there is none and one is required."""
    session = _Process.session
    if session is None and required:
        raise AmpStateError(message or "apexlite.amp is not initialized: call amp.initialize(...) first.")
    return session


def register_overflow_agreement(provider: Optional[Callable[[], Optional[OverflowSync]]]) -> None:
    """Let a distributed layer decide, per new loss scaler, how found-inf flags agree across ranks."""
    _Process.overflow_agreement = provider


@dataclass
class SessionOptions:
    """The options of the latest `initialize` call (what apex kept in `_amp_state`)."""

    properties: Properties = field(default_factory=Properties)
    dtype: torch.dtype = torch.float16
    verbosity: int = 1
    num_losses: int = 1
    min_loss_scale: Optional[float] = None
    max_loss_scale: float = 2.0 ** 24
    max_nonfinite_losses: int = DEFAULT_MAX_NONFINITE_LOSSES


class _ForwardScope(threading.local):
    """Per-thread: the `Module._call_impl` frame of the outermost registered forward running (NOTE [forward scope])."""

    frame: Optional[types.FrameType] = None


_CALL_IMPL_CODE = torch.nn.Module._call_impl.__code__


def _module_call_frame(hook_caller: types.FrameType) -> types.FrameType:
    """The `Module._call_impl` frame that runs a forward hook, given the hook's caller's frame (torch
    calls hooks from `_call_impl` itself or from a function nested in it). Should a torch release call
    them otherwise, the caller's frame stands in: a forward that raises then has its scope ended by
    the next registered forward instead of by its own end hook."""
    frame: Optional[types.FrameType] = hook_caller
    for _ in range(3):
        if frame is None:
            break
        if frame.f_code is _CALL_IMPL_CODE:
            return frame
        frame = frame.f_back
    return hook_caller


def _on_stack(target: types.FrameType, frame: Optional[types.FrameType]) -> bool:
    """True when `target` is `frame` or one of its callers (the call it stands for is still running)."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


class ForwardScopeStart:
    """Forward pre-hook of registered O1 models. Stateless (it finds the current session when called),
    so models stay deep-copyable and picklable; on a copy it is harmless and correct."""

    def __call__(self, module: Any, args: Any) -> None:
        session = _Process.session
        if session is not None and not tracing():  # compiled graphs hold their own casts, not the cache's
            session.enter_forward(_module_call_frame(sys._getframe(1)))


class ForwardScopeEnd:
    """Forward hook pairing ForwardScopeStart (runs when the forward returns or raises an Exception;
    an interrupted forward is found out by the next ForwardScopeStart, NOTE [forward scope])."""

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        session = _Process.session
        if session is not None and not tracing():
            session.exit_forward(_module_call_frame(sys._getframe(1)))


class AmpSession:
    """Owns the patchers, cast cache, loss scalers, per-optimizer state and run statistics."""

    def __init__(self) -> None:
        self.options = SessionOptions()
        self.patcher = Patcher()  # optimizer wrappers, model hooks
        self.o1_patcher = Patcher()  # torch function wrappers (O1), undone alone by a handle's _deactivate
        self.o1_registrations: List[Any] = []  # user registrations the installed O1 patches include
        self.o1_graph_dtype: Optional[torch.dtype] = None  # the low dtype compiled graphs were last made for under O1
        self.cache, self.cast_state = make_cache_and_state(torch.float16)  # native or Python, see native_casts
        self.cast_state.active = False
        self.loss_scalers: List[LossScaler] = []
        # id(optimizer) -> AmpOptimizer, alive as long as its optimizer (which holds it as `_amp_stash`)
        self.optimizers: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
        self.models: WeakOrderedSet[torch.nn.Module] = WeakOrderedSet()
        self.scoped_models: WeakOrderedSet[torch.nn.Module] = WeakOrderedSet()  # their outermost forward ends a cast scope
        self.forward_scope = _ForwardScope()
        self.model_loads = ModelLoads()  # weights O2 models' load_state_dict wrote, until the masters take them
        self.model_moves: Any = None  # O1: torch's Module._apply while it is patched (device_scope.py)
        self.from_initialize = False  # something was registered by amp.initialize (not only amp.init)
        self.handle: Any = None  # the O1 handle (`amp._amp_state.handle`), see apexlite/amp/handle.py
        self.stats = RunStats(keep_samples=telemetry_requested())
        self.closed = False

    # --- options ---------------------------------------------------------------------------------
    @property
    def properties(self) -> Properties:
        return self.options.properties

    @property
    def dtype(self) -> torch.dtype:
        return self.options.dtype

    @property
    def verbosity(self) -> int:
        return self.options.verbosity

    def configure(self, options: SessionOptions) -> None:
        """Apply the latest call's options; the loss scalers are replaced by fresh ones (as in apex)."""
        self.options = options
        self.cast_state.low_dtype = options.dtype
        self.cast_state.log_casts = options.verbosity >= 2
        self.loss_scalers = [self.new_loss_scaler(options.properties.loss_scale) for _ in range(options.num_losses)]
        self.stats.opt_level = options.properties.opt_level
        self.stats.dtype = str(options.dtype).replace("torch.", "")

    def new_loss_scaler(self, loss_scale: Any) -> LossScaler:
        """A scaler with the session's bounds and the plugged-in cross-rank overflow agreement."""
        provider = _Process.overflow_agreement
        scaler = LossScaler(loss_scale, min_loss_scale=self.options.min_loss_scale,
                            max_loss_scale=self.options.max_loss_scale,
                            overflow_sync=provider() if provider is not None else None)
        scaler.nonfinite_loss_limit = self.options.max_nonfinite_losses
        return scaler

    def publish(self) -> None:
        """Make this the process's current session."""
        _Process.session = self
        track_session(self)

    def own_weights(self, models: Iterable[torch.nn.Module], optimizers: Iterable[Any]) -> None:
        """Let the cast cache hold the casts of these newly registered models' and optimizers' weights
        strongly (cache.py's NOTE [cast cache lifetime]); every other tensor's casts it holds weakly.
        Only the new registrations are walked, so a call costs what it registers."""
        weights = {id(p): p for model in models for p in model.parameters()}
        weights.update((id(p), p) for optimizer in optimizers for group in optimizer.param_groups
                       for p in group["params"])
        self.cache.own(list(weights.values()))

    # --- logging -------------------------------------------------------------------------------
    def info(self, message: str, *args, all_ranks: bool = False) -> None:
        """Log at verbosity >= 1 (rank 0 only unless `all_ranks`)."""
        if self.verbosity >= 1 and (all_ranks or is_rank_zero()):
            log.info(message, *args)

    # --- casting -------------------------------------------------------------------------------
    @property
    def patches_torch(self) -> bool:
        return bool(self.properties.patch_torch_functions)

    def casts_disabled(self) -> Any:
        """A block with O1 casts off in the calling thread only (nesting-safe, left on the same thread)."""
        return self.cast_state.disabled()

    def release_casts(self) -> None:
        """Drop cached weight casts without ending the iteration (the forward pass is over)."""
        self.cache.clear()

    def end_iteration(self) -> None:
        """Iteration boundary: drop cached weight casts (and this thread's interrupted forward scope)."""
        self.stats.record_casts(self.cache)
        self.cache.clear()
        scope = self.forward_scope
        if scope.frame is not None and not _on_stack(scope.frame, sys._getframe()):
            scope.frame = None
            self.cast_state.thread.in_forward = False

    def enter_forward(self, frame: types.FrameType) -> None:
        """A registered model's forward starts in the `_call_impl` frame `frame` (NOTE [forward scope])."""
        scope = self.forward_scope
        if scope.frame is not None:
            if _on_stack(scope.frame, frame):
                return  # nested in the outermost registered forward
            self.cache.clear()  # the recorded forward was interrupted: its scope is over
        scope.frame = frame
        self.cast_state.thread.in_forward = True

    def exit_forward(self, frame: types.FrameType) -> None:
        """When the outermost forward returns, its casts may be stale by the next one (a
        `p.data.copy_` between forwards changes no version counter), so they are dropped."""
        scope = self.forward_scope
        if scope.frame is frame:
            scope.frame = None
            self.cast_state.thread.in_forward = False
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
                "optimizers, ...) and use the objects it returns; one created after initialize is registered "
                f"by `_, optimizer = amp.initialize([], optimizer, opt_level={self.properties.opt_level!r})` (the "
                "models stay as the first call left them)."
            )
        return state

    # --- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Undo every patch and forget all state. Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            for amp_optimizer in list(self.optimizers.values()):
                amp_optimizer.detach()
            self.o1_patcher.undo_all()
            self.patcher.undo_all()
        finally:
            self.cast_state.active = False
            self.cache.clear()
            self.cache.disown_all()
            self.forward_scope = _ForwardScope()
            self.model_loads.take()
            self.optimizers.clear()
            self.models.clear()
            self.scoped_models.clear()
            if _Process.session is self:
                _Process.session = None
