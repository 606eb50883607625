"""LossScaler: static or dynamic loss scaling with apex's rules and checkpoint format.

Dynamic rule (a pure function, `next_scale`): start at min(2**16, max_loss_scale); on an overflow
halve the scale (never below `min_loss_scale` when one is set, nor below SCALE_FLOOR, where 1/scale
is still a comfortable float32) and restart the clean-step count; after `scale_window` consecutive
clean `scale_loss` exits double it (never above `max_loss_scale`).

Overflow detection is one device-side pass per (device, dtype) group that unscales and sets a
`found_inf` tensor (`unscale.py`); the only host sync is reading that flag once in `update_scale`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import torch

from apexlite._logging import get_logger
from apexlite.amp.errors import AmpConfigError, NonFiniteLossError
from apexlite.amp.unscale import FoundInf, unscale_and_check

LossScaleSpec = Union[float, str]
# Makes the found-inf flags agree across processes before they are read (see NOTE [overflow agreement]
# in apexlite/parallel/overflow.py, which provides the distributed one).
OverflowSync = Callable[[FoundInf], None]

# Below this a dynamic scale stops halving: apex let it fall to 0, where 1/scale is inf and every
# unscaled gradient (and then every weight) becomes NaN. Overflows at this scale come from inf/NaN in
# the forward pass or the loss, which no scale can fix.
SCALE_FLOOR = 2.0 ** -24
STATIC_OVERFLOW_WARNING = 10  # consecutive overflows at a static scale before apexlite says nothing trains

log = get_logger("amp")


def next_scale(scale: float, unskipped: int, overflow: bool, *, scale_factor: float, scale_window: int,
               min_loss_scale: Optional[float], max_loss_scale: float) -> Tuple[float, int]:
    """The dynamic scaler's transition: (scale, clean-step count) after one `scale_loss` exit."""
    if overflow:
        scale = max(scale / scale_factor, min_loss_scale or SCALE_FLOOR, SCALE_FLOOR)
        return scale, 0
    unskipped += 1
    if unskipped == scale_window:
        return min(max_loss_scale, scale * scale_factor), 0
    return scale, unskipped


class LossScaler:
    """One loss's scale. `_loss_scale` and `_unskipped` keep apex's names (third-party code reads them)."""

    def __init__(self, loss_scale: LossScaleSpec, init_scale: float = 2.0 ** 16, scale_factor: float = 2.0,
                 scale_window: int = 2000, min_loss_scale: Optional[float] = None,
                 max_loss_scale: float = 2.0 ** 24, overflow_sync: Optional[OverflowSync] = None) -> None:
        self.dynamic = loss_scale == "dynamic"
        self._loss_scale = min(max_loss_scale, init_scale) if self.dynamic else float(loss_scale)
        self._unskipped = 0
        self._scale_seq_len = scale_window
        self._scale_factor = scale_factor
        self._min_loss_scale = min_loss_scale
        self._max_loss_scale = max_loss_scale
        self._found_inf: Dict[torch.device, torch.Tensor] = {}
        self._has_overflow = False
        # apex's int32 overflow flag: scripts swap their own in before calling update_scale (NVIDIA's BERT)
        self._overflow_buf = torch.zeros(1, dtype=torch.int32)
        self.overflow_check_pending = False  # a scale_loss(delay_overflow_check=True) left the check to update_scale
        self._nonfinite_losses = 0  # consecutive overflow steps whose loss itself was inf/NaN
        self._static_overflows = 0  # consecutive overflows at a static scale
        self.nonfinite_loss_limit = 0  # set by the session; 0 = never stop the run
        # NOTE [overflow agreement] (apexlite/parallel/overflow.py): None in a single process
        self.overflow_sync = overflow_sync

    def loss_scale(self) -> float:
        return self._loss_scale

    @property
    def checks_overflow(self) -> bool:
        """Static 1.0 costs nothing: no unscale and no check. Every other setting checks."""
        return self.dynamic or self._loss_scale != 1.0

    def clear_overflow_state(self) -> None:
        self._has_overflow = False
        for flag in self._found_inf.values():
            flag.zero_()
        self._overflow_buf.zero_()

    @torch._disable_dynamo  # run as it is under torch.compile: a traced Python scale recompiled at every new value
    def unscale(self, grads: Iterable[torch.Tensor]) -> None:
        """Unscale `grads` in place, accumulating the device-side overflow flag."""
        unscale_and_check(grads, 1.0 / self._loss_scale, self._found_inf)

    def check(self, grads: Iterable[torch.Tensor]) -> None:
        """Flag inf/NaN in `grads` (left scaled: the multiply by 1.0 is exact) into the overflow flag."""
        unscale_and_check(grads, 1.0, self._found_inf)

    def found_inf_tensor(self, device: torch.device) -> torch.Tensor:
        """The device-side overflow flag (created zeroed on first use)."""
        flag = self._found_inf.get(device)
        if flag is None:
            flag = self._found_inf[device] = torch.zeros(1, dtype=torch.float32, device=device)
        return flag

    def has_overflow(self) -> bool:
        """Read the overflow flags: the one host sync per `scale_loss`."""
        if not self._has_overflow and self.overflow_sync is not None:
            self.overflow_sync(self._found_inf)
        if not self._has_overflow and self._found_inf:
            self._has_overflow = any(bool(flag.item()) for flag in self._found_inf.values())
        if not self._has_overflow and bool(self._overflow_buf.any()):
            self._has_overflow = True
        return self._has_overflow

    def update_scale(self) -> bool:
        """Advance the schedule after a `scale_loss` exit; returns True when the step must be skipped.

        A static scaler keeps its scale, but still skips a step whose gradients overflowed. The overflow is
        what the last unscale found or what ``_overflow_buf`` (apex's flag, which a script may swap) holds.
        """
        self.overflow_check_pending = False
        overflow = self.has_overflow() if self.checks_overflow else False
        if self.dynamic:
            self._loss_scale, self._unskipped = next_scale(
                self._loss_scale, self._unskipped, overflow, scale_factor=self._scale_factor,
                scale_window=self._scale_seq_len, min_loss_scale=self._min_loss_scale,
                max_loss_scale=self._max_loss_scale,
            )
        elif not overflow:
            self._unskipped += 1
            self._static_overflows = 0
        else:
            self._note_static_overflow()
        return overflow

    def _note_static_overflow(self) -> None:
        """A static scale that overflows step after step trains nothing (every step is skipped): said at 10
        consecutive overflows, then at 100, 1000, ..."""
        self._static_overflows += 1
        count = self._static_overflows
        if count >= STATIC_OVERFLOW_WARNING and math.log10(count / STATIC_OVERFLOW_WARNING).is_integer():
            log.warning("%d consecutive steps overflowed at the static loss scale %g and were skipped: the model is "
                        "not training. Lower loss_scale or use loss_scale='dynamic'.", count, self._loss_scale)

    def count_loss(self, loss: torch.Tensor) -> None:
        """After an overflow: count consecutive non-finite losses and stop the run at the limit.

        Reads the loss on the host, only on overflow steps (normal steps cost nothing extra).
        """
        if bool(torch.isfinite(loss.detach()).all()):
            self._nonfinite_losses = 0
            return
        self._nonfinite_losses += 1
        if self.nonfinite_loss_limit and self._nonfinite_losses >= self.nonfinite_loss_limit:
            raise NonFiniteLossError(
                f"the loss itself was inf/NaN in {self._nonfinite_losses} consecutive iterations (loss scale "
                f"now {self._loss_scale:g}): loss scaling cannot fix a non-finite loss, and every step was "
                "skipped. Look for NaN/inf in the inputs, labels or forward pass (e.g. "
                "torch.autograd.set_detect_anomaly(True), a log of 0, a too-high learning rate). The "
                "limit is amp.initialize(..., max_nonfinite_losses=N); 0 disables this check."
            )

    def note_clean_step(self) -> None:
        self._nonfinite_losses = 0

    def state_dict(self) -> dict:
        return {"loss_scale": self._loss_scale, "unskipped": self._unskipped}

    def load_state_dict(self, state: Any) -> None:
        """Accept apex's `{loss_scale, unskipped}` or a torch GradScaler state dict (validated first)."""
        self.restore(*parse_scaler_state(state, self._max_loss_scale))

    def restore(self, scale: float, unskipped: int) -> None:
        """Take a validated checkpoint's scale and clean-step count (a static scale too, as apex did: said)."""
        self._unskipped = unskipped
        if not self.dynamic and scale != self._loss_scale:
            log.warning("a loaded loss scaler state replaces this run's static loss scale %g with %g (as apex "
                        "did); keep %g by leaving the checkpoint's amp state out", self._loss_scale, scale,
                        self._loss_scale)
        self._loss_scale = scale


def parse_scaler_state(state: Any, max_loss_scale: float, name: str = "loss scaler state") -> Tuple[float, int]:
    """(loss_scale, unskipped) from apex's or torch GradScaler's format; a clear error for anything else.

    A scale above `max_loss_scale` is clamped with a warning (the scaler would never reach it).
    """
    expected = "{'loss_scale': <finite float > 0>, 'unskipped': <int >= 0>}"
    if not isinstance(state, dict):
        raise AmpConfigError(f"{name} must be a dict like {expected}; got {type(state).__name__}.")
    if "scale" in state and "loss_scale" not in state:  # torch.amp.GradScaler.state_dict()
        scale, unskipped = state["scale"], state.get("_growth_tracker", 0)
    else:
        missing = [key for key in ("loss_scale", "unskipped") if key not in state]
        if missing:
            raise AmpConfigError(f"{name} lacks {', '.join(missing)}: expected {expected}; got keys {sorted(state)}.")
        scale, unskipped = state["loss_scale"], state["unskipped"]
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.item()
    if isinstance(unskipped, torch.Tensor) and unskipped.numel() == 1 and not unskipped.is_floating_point():
        unskipped = unskipped.item()
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise AmpConfigError(
            f"{name}: loss_scale must be a finite number > 0 (a negative scale would flip every gradient); "
            f"got {scale!r}. Expected {expected}."
        )
    if isinstance(unskipped, bool) or not isinstance(unskipped, int) or unskipped < 0:
        raise AmpConfigError(f"{name}: unskipped must be an int >= 0; got {unskipped!r}. Expected {expected}.")
    if scale > max_loss_scale:
        log.warning("%s: loss_scale %g is above max_loss_scale %g; using %g", name, scale, max_loss_scale,
                    max_loss_scale)
        scale = max_loss_scale
    return float(scale), unskipped
