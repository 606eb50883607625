"""The pre-2019 handle API: `handle = amp.init(...)`, `handle.scale_loss(loss, optimizer)`,
`handle.wrap_optimizer(optimizer, num_loss)`, `handle._deactivate()`, as apex's own tests and early
scripts use it.

`amp.init` applies O1's casts (fp16 unless APEXLITE_DTYPE says otherwise) without models: optimizers
are registered the first time a handle's `scale_loss` (or an OptimWrapper) sees them, so their
`step()` learns to skip overflowing updates. A handle shares the session of `amp.initialize`, whose
O1 calls create one too (`amp._amp_state.handle`).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, List

import torch

from apexlite.amp.amp_optimizer import AmpOptimizer
from apexlite.amp.plain_grads import PlainGrads
from apexlite.amp.environment import DTYPE_ENV, parse_dtype
from apexlite.amp.errors import AmpUsageError
from apexlite.amp.o1.device_scope import rescope
from apexlite.amp.o1.patches import set_o1_patches
from apexlite.amp.opt_levels import resolve_properties
from apexlite.amp.o1.registry import PendingRegistrations
from apexlite.amp.scale_loss import scaled_backward
from apexlite.amp.session import AmpSession, SessionOptions, current_session
from apexlite.amp.transaction import InitializeTransaction

WRAPPED_SCALE_LOSS_MESSAGE = ("After calling `handle.wrap_optimizer()`, you must explicitly use "
                              "`optimizer.scale_loss(loss)`.")


def _registered(session: AmpSession, optimizer: Any) -> AmpOptimizer:
    """The optimizer's AmpOptimizer, registering it (plain grads, recorded step wrapper) on first use."""
    amp_optimizer = session.amp_optimizer(optimizer, required=False)
    if amp_optimizer is None:
        amp_optimizer = AmpOptimizer(optimizer, session, PlainGrads(optimizer))
        session.optimizers[id(optimizer)] = amp_optimizer
        amp_optimizer.install()
        session.own_weights([], [optimizer])
    return amp_optimizer


class AmpHandle:
    """What `amp.init()` returns: the O1 casts' switch and the old-style loss scaling."""

    def __init__(self, session: AmpSession, loss_scale: Any = "dynamic") -> None:
        self._session = session
        self._default_scaler = session.new_loss_scaler(loss_scale)
        self._is_active = True

    def is_active(self) -> bool:
        return self._is_active and not self._session.closed

    def _disable_casts(self) -> Any:
        """A block with casts off in the calling thread (left on the same thread)."""
        return self._session.casts_disabled()

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor, optimizer: Any) -> Iterator[torch.Tensor]:
        """Yield `loss * scale`; on exit unscale the optimizer's grads and skip its next step on overflow."""
        if not self.is_active():
            yield loss
            return
        if self._default_scaler is None:
            raise RuntimeError(WRAPPED_SCALE_LOSS_MESSAGE)
        amp_optimizer = _registered(self._session, optimizer)
        with scaled_backward(self._session, loss, [amp_optimizer], self._default_scaler, 0, False,
                             as_float=False) as scaled:
            yield scaled

    def wrap_optimizer(self, optimizer: Any, num_loss: int = 1) -> "OptimWrapper":
        """An optimizer wrapper with one loss scaler per loss (`wrapper.scale_loss(loss)` per loss)."""
        self._default_scaler = None
        return OptimWrapper(optimizer, self, num_loss)

    def _clear_cache(self) -> None:
        self._session.cache.clear()

    def _deactivate(self) -> None:
        """Undo the O1 patches. A session that only `amp.init` created is closed entirely."""
        self._is_active = False
        session = self._session
        set_o1_patches(session, False, [])
        if not session.from_initialize:
            session.close()

    @property
    def has_cache(self) -> bool:
        return self._session.cast_state.use_cache

    @property
    def cache(self) -> Any:
        return self._session.cache

    def remove_cache(self, param: torch.Tensor) -> None:
        if self.has_cache:
            self._session.cache.remove(param)

    @property
    def verbose(self) -> bool:
        return self._session.cast_state.log_casts


class NoOpHandle:
    """What `amp.init(enabled=False)` returns: casts inactive, `scale_loss` yields the loss unchanged."""

    has_cache = False
    verbose = False

    def is_active(self) -> bool:
        return False

    def _disable_casts(self) -> Any:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def scale_loss(self, loss: Any, optimizer: Any) -> Iterator[Any]:
        yield loss

    def wrap_optimizer(self, optimizer: Any, num_loss: int = 1) -> "OptimWrapper":
        return OptimWrapper(optimizer, self, num_loss)

    def _clear_cache(self) -> None:
        """Nothing is cached when amp is disabled."""

    def _deactivate(self) -> None:
        """Nothing was patched when amp is disabled."""

    def remove_cache(self, param: Any) -> None:
        """Nothing is cached when amp is disabled."""


class OptimWrapper:
    """The old API's optimizer wrapper: `scale_loss(loss)` once per loss (each with its own dynamic
    scaler), then `step()`, which is skipped when any of those losses overflowed."""

    def __init__(self, optimizer: Any, amp_handle: Any, num_loss: int) -> None:
        if isinstance(num_loss, bool) or not isinstance(num_loss, int) or num_loss < 1:
            raise AmpUsageError(f"num_loss must be an int >= 1; got {num_loss!r}.")
        self._optimizer = optimizer
        self._amp_handle = amp_handle
        self._num_loss = num_loss
        self._loss_idx = 0
        session = getattr(amp_handle, "_session", None)
        self._loss_scaler: List[Any] = ([session.new_loss_scaler("dynamic") for _ in range(num_loss)]
                                        if session is not None else [])

    @contextlib.contextmanager
    def scale_loss(self, loss: torch.Tensor) -> Iterator[torch.Tensor]:
        if not self._amp_handle.is_active():
            yield loss
            return
        if self._loss_idx >= self._num_loss:
            raise AmpUsageError(
                f"scale_loss was called {self._loss_idx + 1} times before step(), but wrap_optimizer was given "
                f"num_loss={self._num_loss}. Pass num_loss equal to the number of losses per step."
            )
        session = self._amp_handle._session
        amp_optimizer = _registered(session, self._optimizer)
        with scaled_backward(session, loss, [amp_optimizer], self._loss_scaler[self._loss_idx], self._loss_idx,
                             False, as_float=False) as scaled:
            yield scaled
        self._loss_idx += 1

    def step(self, closure: Any = None) -> Any:
        if not self._amp_handle.is_active():
            return self._optimizer.step(closure=closure) if closure is not None else self._optimizer.step()
        self._loss_idx = 0
        for group in self._optimizer.param_groups:
            for param in group["params"]:
                self._amp_handle.remove_cache(param)
        if closure is not None:
            raise NotImplementedError("The `closure` argument is unsupported by the amp optimizer wrapper.")
        return self._optimizer.step()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_optimizer":
            raise AttributeError(attr)
        return getattr(self._optimizer, attr)

    def __repr__(self) -> str:
        return repr(self._optimizer)

    def state_dict(self) -> Any:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Any) -> Any:
        return self._optimizer.load_state_dict(state_dict)

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.zero_grad(*args, **kwargs)

    def add_param_group(self, param_group: Any) -> Any:
        return self._optimizer.add_param_group(param_group)


def init(enabled: bool = True, loss_scale: Any = "dynamic", enable_caching: bool = True, verbose: bool = False,
         allow_banned: bool = False) -> Any:
    """apex's `amp.init`: O1 casts for the whole process, returned as a handle (NoOpHandle when disabled)."""
    if not enabled:
        return NoOpHandle()
    dtype = parse_dtype(os.environ.get(DTYPE_ENV) or torch.float16, DTYPE_ENV)
    properties = resolve_properties("O1", dtype, {"loss_scale": loss_scale})
    existing = current_session(required=False)
    session = existing if existing is not None else AmpSession()
    transaction = InitializeTransaction(session, [], [])  # all-or-nothing, as initialize
    try:
        if existing is None:
            session.configure(SessionOptions(properties, dtype, verbosity=2 if verbose else 0))
        state = session.cast_state
        state.use_cache, state.allow_banned, state.log_casts = bool(enable_caching), bool(allow_banned), bool(verbose)
        rescope(session)  # NOTE [device scope]: CUDA, as apex, where there is CUDA
        transaction.taken_registrations = PendingRegistrations.take()
        set_o1_patches(session, True, transaction.taken_registrations)
        session.handle = AmpHandle(session, properties.loss_scale)
    except BaseException:
        transaction.rollback()
        if existing is None:
            session.close()
        raise
    session.publish()
    return session.handle
