"""AmpOptimizer: apexlite's per-optimizer state, and how amp takes part in its step.

Where amp replaces `optimizer.step`, where it uses step hooks instead, and how a step after an
overflow is skipped is described in optimizer_step.py. Gradient bookkeeping is delegated to a
strategy (grad_strategy.GradStrategy): `PlainGrads` (plain_grads.py; O0/O1/O3: grads live on the
params the optimizer steps), `MasterParams` (O2: fp32 masters, see master.py) or `FusedMasterGrads`
(O2 with an optimizer that keeps the masters and unscales in its own step, see fused_master.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpStateError, AmpUsageError
from apexlite.amp.master_sync import several_processes
from apexlite.amp.plain_grads import PlainGrads
from apexlite.amp.optimizer_step import OneShotSkip, bind_amp_step, replaces_step
from apexlite.amp.scaler import SCALE_FLOOR, LossScaler
from apexlite.amp.stash_lists import ApexStashLists

if TYPE_CHECKING:
    from apexlite.amp.grad_strategy import GradStrategy

log = get_logger("amp")

OVERFLOW_MESSAGE = "Gradient overflow.  Skipping step, loss scaler {} reducing loss scale to {}"
LAZY_INIT_METHODS = ("_lazy_init_maybe_master_weights", "_amp_lazy_init")
STATIC_OVERFLOW_MESSAGE = "Gradient overflow.  Skipping step, loss scaler {} keeps its static loss scale {}"
FLOOR_OVERFLOW_MESSAGE = ("Gradient overflow.  Skipping step, loss scaler {} is at its floor {} (apexlite's lowest "
                          "scale: overflows there come from inf/NaN that no scale fixes)")


class AmpOptimizer(ApexStashLists):
    """What apexlite knows about one optimizer passed to `initialize`."""

    def __init__(self, optimizer: Any, session: Any, grads: "GradStrategy") -> None:
        self.optimizer = optimizer
        self.session = session
        self.grads = grads
        self.params_have_scaled_gradients = False
        self.lazy_init_called = True  # masters are built eagerly; kept for code that reads the flag
        self._pending_skip: Optional[Tuple[int, LossScaler]] = None
        self._deferred_check: Optional[Tuple[int, LossScaler]] = None  # scale_loss(delay_overflow_check=True)
        self._skip = OneShotSkip(optimizer)
        self._original_step: Optional[Callable[..., Any]] = None  # set where amp replaces the step
        self._hooked_depth = 0  # nesting of hooked steps (a subclass's step calling its base's step)
        self._model_grad_versions: List[Tuple[torch.Tensor, int]] = []  # O2: the half grads scale_loss left
        self._warned_model_grads_changed = False
        self._warned_mixed_scales = False  # delay_unscale grads of one loss scale unscaled with another
        self._delayed_scales: set = set()  # the loss scales of the grads delay_unscale left scaled

    # apex exposed this on `optimizer._amp_stash`; some libraries read it
    @property
    def already_patched(self) -> bool:
        return self._pending_skip is not None

    @property
    def replaced_step(self) -> bool:
        """True where amp replaced `optimizer.step` (master weights, O1 casts), as apex did."""
        return self._original_step is not None

    def install(self) -> None:
        """Reach the step (replaced or hooked, see optimizer_step.py) and let the grad strategy wrap
        what it needs, all through the session's Patcher."""
        patcher = self.session.patcher
        patcher.set_attribute(self.optimizer, "_amp_stash", self)
        for name in LAZY_INIT_METHODS:  # apex's private methods that scripts call (BERT's resume)
            patcher.set_attribute(self.optimizer, name, self.grads.lazy_init)
        casts_active = self.session.patches_torch or self.session.cast_state.active
        if replaces_step(self.optimizer, self.has_masters, casts_active):
            # on an instance, the recorded original is the bound step the optimizer had before
            self._original_step = patcher.set_attribute(self.optimizer, "step", bind_amp_step(self.optimizer))
        else:
            label = type(self.optimizer).__name__
            patcher.add_handle(self.optimizer.register_step_pre_hook(self._before_hooked_step),
                               f"{label} step pre-hook", owner=self.optimizer)
            patcher.add_handle(self.optimizer.register_step_post_hook(self._after_hooked_step),
                               f"{label} step post-hook", owner=self.optimizer)
        self.grads.install(patcher)

    # --- backward bookkeeping, called by scale_loss ---------------------------------------------
    def prepare_backward(self, scale: float = 1.0) -> None:
        self._hooked_depth = 0  # a step that raised inside its hooks ended there
        if self._pending_skip is not None and not self.params_have_scaled_gradients and several_processes():
            # This step is skipped: its grads go now. Across ranks later micro-batches add to them in place, and
            # each would find the overflow again and lower the scale again (once per micro-batch, not once).
            self.grads.on_skip()
        if not self.params_have_scaled_gradients:
            self.grads.prepare(scale)

    def post_backward(self, scaler: LossScaler, delay_unscale: bool) -> None:
        if delay_unscale:
            if not self.params_have_scaled_gradients:
                self._delayed_scales = set()
            self._delayed_scales.add(scaler.loss_scale())
            self.params_have_scaled_gradients = True
            return
        if self.params_have_scaled_gradients and self._delayed_scales - {scaler.loss_scale()} \
                and not self._warned_mixed_scales:
            self._warned_mixed_scales = True
            current = scaler.loss_scale()
            off = ", ".join(f"{scale / current:g}x too large" if scale > current else f"{current / scale:g}x too small"
                            for scale in sorted(self._delayed_scales - {current}))
            log.warning("amp: %s's grads kept scaled by delay_unscale=True carry loss scale(s) %s, and this "
                        "scale_loss unscales them all with its own, %s, as apex did: they come out %s. Use one "
                        "loss_id for the blocks of an accumulation, or delay_unscale=False (said once per "
                        "optimizer)", type(self.optimizer).__name__, sorted(self._delayed_scales), current, off)
        self.grads.post(scaler)
        self.params_have_scaled_gradients = False
        if self.has_masters and not self._warned_model_grads_changed:
            self._model_grad_versions = [(grad, grad._version) for grad in self.grads.model_grad_sample()]

    def new_grads(self) -> List[torch.Tensor]:
        return self.grads.new_grads()

    def discard_backward(self) -> None:
        """The block raised and its grads overflowed: back to the grads from before the block."""
        self.grads.discard_new()
        self.params_have_scaled_gradients = False

    @property
    def has_masters(self) -> bool:
        """True when the optimizer steps fp32 masters (O2): grads always need the bookkeeping."""
        return not isinstance(self.grads, PlainGrads)

    def skip_next_step(self, loss_id: int, scaler: LossScaler) -> None:
        """The next `optimizer.step()` is skipped (one-shot, as apex did it)."""
        if self._pending_skip is None:
            self._pending_skip = (loss_id, scaler)
            self._skip.install()

    def defer_overflow_check(self, loss_id: int, scaler: LossScaler) -> None:
        """scale_loss(delay_overflow_check=True): the script's `update_scale()` decides; the next step goes
        through amp's step, which checks then if the script did not."""
        self._deferred_check = (loss_id, scaler)
        self._skip.install()

    def _settle_deferred_check(self) -> None:
        if self._deferred_check is None:
            return
        loss_id, scaler = self._deferred_check
        self._deferred_check = None
        if scaler.overflow_check_pending and scaler.update_scale():
            self.session.info("amp.scale_loss(..., delay_overflow_check=True) overflowed and no update_scale() was called "
                     "before optimizer.step(): apexlite checked the overflow itself and skips this step (apex "
                     "would have stepped on the inf/NaN grads)")
            self._pending_skip = (loss_id, scaler)
        elif self._pending_skip is None:
            self._skip.remove()

    # --- the step ------------------------------------------------------------------------------
    def _check_step_call(self, closure: Any) -> None:
        if closure is not None:
            raise AmpUsageError(
                "optimizer.step(closure) is not supported under apexlite.amp: a closure's backward "
                "would bypass amp.scale_loss. Run the forward and `with amp.scale_loss(loss, optimizer) "
                "as scaled: scaled.backward()` yourself, then call optimizer.step() without a closure."
            )
        if self.params_have_scaled_gradients:
            raise AmpStateError(
                "optimizer.step() was called while the gradients are still scaled: the last "
                "amp.scale_loss used delay_unscale=True. Finish the accumulation with one scale_loss "
                "block with delay_unscale=False (the default) before stepping."
            )

    def step_call(self, closure: Any, args: tuple, kwargs: dict) -> Any:
        """`optimizer.step(...)` where amp bound its step (see optimizer_step.amp_step)."""
        self._check_step_call(closure)
        self._settle_deferred_check()
        if self._pending_skip is not None:
            return self._skip_step()
        if self.replaced_step:
            return self._run_replaced_step(args, kwargs)
        return self._skip.step_beneath()(*args, **kwargs)  # the one-shot skip was wrapped and outlived

    def _skip_step(self) -> None:
        loss_id, scaler = self._pending_skip
        try:
            self._pending_skip = None
            self._skip.remove()
        finally:  # the overflowed grads go whatever happens (they must never reach a later step)
            self.grads.on_skip()
        self.session.stats.record_step(skipped=True)
        template = STATIC_OVERFLOW_MESSAGE if not scaler.dynamic else \
            FLOOR_OVERFLOW_MESSAGE if scaler.loss_scale() <= SCALE_FLOOR else OVERFLOW_MESSAGE
        self.session.info(template.format(loss_id, scaler.loss_scale()), all_ranks=True)
        return None

    def _warn_if_model_grads_changed(self) -> None:
        """O2: a change to the model's half grads after scale_loss (a clip of `model.parameters()`) does not clip
        the update, which follows the fp32 masters' grads; apex said nothing, apexlite says it once."""
        changed = any(grad._version != version for grad, version in self._model_grad_versions)
        self._model_grad_versions = []
        if changed:
            self._warned_model_grads_changed = True
            log.warning(
                "%s: the model's low-precision grads changed between amp.scale_loss and optimizer.step() "
                "(clip_grad_norm_(model.parameters(), ...)?). At O2 they stay multiplied by the loss scale and "
                "the update follows the fp32 master params' grads, so this does not clip the update (apex "
                "behaved the same). Clip amp.master_params(optimizer) instead. (Said once.)",
                type(self.optimizer).__name__)

    def _run_replaced_step(self, args: tuple, kwargs: dict) -> Any:
        self._warn_if_model_grads_changed()
        self.grads.before_step()
        try:
            if self.session.cast_state.active:  # O1: the update itself runs in the params' own dtypes
                with self.session.casts_disabled():
                    result = self._original_step(*args, **kwargs)
            else:
                result = self._original_step(*args, **kwargs)
        except BaseException:
            self._settle_failed_step()
            raise
        self._step_done()
        return result

    def _settle_failed_step(self) -> None:
        """The step raised (NOTE [the masters are the truth] in master.py). Where its update had finished
        (a later post-hook raised) it is done as any other step; otherwise the grad strategy makes the
        model follow whatever the masters hold and keeps the grads for a retry."""
        if self.grads.update_finished:
            self._step_done()
            return
        self.session.cache.clear()
        self.grads.abandon_step()

    def _step_done(self) -> None:
        self.grads.after_step()
        self.session.cache.clear()
        self.session.stats.record_step(skipped=False)

    def _before_hooked_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        """Step pre-hook (O0/O3): the checks of a replaced step; nested calls pass through."""
        self._hooked_depth += 1
        if self._hooked_depth > 1:
            return None
        try:
            self._check_step_call(args[1] if len(args) > 1 else kwargs.get("closure"))
            if self._pending_skip is not None:
                raise AmpStateError(
                    "optimizer.step was reached without going through the `optimizer.step` attribute after "
                    "a gradient overflow, so amp could not skip it (was a reference to optimizer.step or "
                    "the class's step called?). Call optimizer.step() on the optimizer after each "
                    "amp.scale_loss block."
                )
        except BaseException:
            self._hooked_depth = 0
            raise
        self.grads.before_step()
        return None

    def _after_hooked_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        """Step post-hook (O0/O3): the bookkeeping of a replaced step, once per outermost step."""
        self._hooked_depth -= 1
        if self._hooked_depth > 0:
            return
        self._hooked_depth = 0
        self._step_done()

    def detach(self) -> None:
        """Session teardown: forget pending state and a pending skip; the grad strategy restores what it changed."""
        self._pending_skip = self._deferred_check = None
        self._skip.remove()
        self.params_have_scaled_gradients = False
        self.grads.detach()
