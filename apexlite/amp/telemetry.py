"""RunStats: what apexlite observed during a run (steps, losses, skips, casts, step time, memory), and
the step budget that ends an unchanged script after N optimizer steps.

Environment (read when `amp.initialize` creates the session):
  APEXLITE_MAX_STEPS=N      end the script cleanly (exit status 0) once amp's optimizers have run N
                            `step()` calls, skipped overflow steps included; one log line says so.
  APEXLITE_TELEMETRY=FILE   keep samples and write the report to FILE as JSON: about once a second
                            while training, when the budget ends the run, at exit, and on SIGTERM
                            (unless the script handles SIGTERM itself), so a killed run still reports
                            (apexlite.amp.telemetry_writer).
  APEXLITE_WARMUP_STEPS=K   steps left out of the step-time statistics (default 3).

A run that `python -m apexlite sweep` started also pauses between steps when the sweep asks
(apexlite.sweep.gate), so the sweep can time the runs round by round.

Every sample is kept in bounded memory (a reservoir of step times, a downsampled loss curve), and
losses stay device tensors until a report is written, so recording never syncs.
"""
from __future__ import annotations

import atexit
import collections
import json
import math
import os
import resource
import time
import weakref
from typing import Any, Dict, List, Optional

import torch

from apexlite._logging import get_logger, is_rank_zero
from apexlite.amp.advice import find_known_traps
from apexlite.amp.bounded_samples import DownsampledCurve, Reservoir
from apexlite.amp.errors import AmpConfigError
from apexlite.amp.tensor_memory import StepMemoryProbe, cuda_in_use, state_bytes_per_param
from apexlite.sweep.gate import RoundGate

log = get_logger("telemetry")

TELEMETRY_ENV = "APEXLITE_TELEMETRY"
MAX_STEPS_ENV = "APEXLITE_MAX_STEPS"
WARMUP_ENV = "APEXLITE_WARMUP_STEPS"
DEFAULT_WARMUP_STEPS = 3
NONFINITE_GRACE_STEPS = 3  # a non-finite loss in the first steps alone does not count as divergence
FINAL_LOSS_WINDOW = 5  # final_loss is the mean of this many last losses (one batch is noisy)
FLUSH_INTERVAL_S = 1.0
MEMORY_PROBE_MIN_STEP = 2  # the probed step starts at a step boundary, so never the first step


class StepBudgetReached(SystemExit):
    """Raised by the optimizer step that completes the budget; ends the script with exit status 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps


def env_count(name: str, minimum: int) -> Optional[int]:
    """The whole number in environment variable `name` (None when unset), refused below `minimum`; switch_values.py
    checks the switches with it before a command starts."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise AmpConfigError(f"{name} must be a whole number >= {minimum}; got {value!r}. Unset it or fix it.")
    return number


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def _as_float(loss: torch.Tensor) -> float:
    return float(loss.float().mean())


class RunStats:
    """Counters (always) and samples (with `keep_samples`) for one session, plus its step budget."""

    def __init__(self, keep_samples: bool = False) -> None:
        self.keep_samples = keep_samples
        self.max_steps = env_count(MAX_STEPS_ENV, 1)
        warmup = env_count(WARMUP_ENV, 0)
        self.warmup_steps = DEFAULT_WARMUP_STEPS if warmup is None else warmup
        self.scale_loss_calls = 0
        self.steps = 0
        self.skipped_steps = 0
        self.cut_at_budget = False
        self.iterations_with_casts = 0
        self.total_casts = 0
        self.first_loss: Optional[torch.Tensor] = None
        self.last_loss: Optional[torch.Tensor] = None
        self.opt_level: Optional[str] = None
        self.dtype: Optional[str] = None
        self.amp_enabled = True  # the latest amp.initialize call's `enabled`
        self.loss_scale: Optional[float] = None
        # samples, bounded however long the run is
        self.step_times = Reservoir()
        self.loss_curve = DownsampledCurve()  # (step the loss feeds, loss tensor, loss scale or None)
        self.skipped_at = DownsampledCurve()  # step numbers of skipped steps
        self._recent_losses: collections.deque = collections.deque(maxlen=FINAL_LOSS_WINDOW)
        self._nonfinite_losses: Optional[torch.Tensor] = None  # device-side count, no sync per step
        self._last_step_end = time.perf_counter()
        self._own_time = 0.0  # the bookkeeping of record_loss/record_casts since the last step ended
        self._last_flush = -math.inf
        self.memory_probe_step = max(self.warmup_steps, MEMORY_PROBE_MIN_STEP)
        self._probe: Optional[StepMemoryProbe] = None
        self._measure_state_bytes = False
        self.state_bytes_per_param: Optional[float] = None
        self.peak_tensor_bytes: Optional[int] = None
        self.memory_note: Optional[str] = None
        self.known_traps: Optional[List[str]] = None
        self.report_path: Optional[str] = None
        self._session: Any = None
        self._gate = RoundGate.from_environment() if keep_samples else None  # a sweep's rounds pace the run

    @property
    def total_steps(self) -> int:
        """Every `step()` call of amp's optimizers so far, applied or skipped."""
        return self.steps + self.skipped_steps

    def attach(self, session: Any, report_path: Optional[str]) -> None:
        """Let reports read the session's models, optimizers and loss scale, and go to `report_path`."""
        self._session = weakref.ref(session)
        self.report_path = report_path

    # --- recording (called by scale_loss, the session and AmpOptimizer) ---------------------------
    @torch._disable_dynamo  # run as it is under torch.compile: its host floats (a clock) recompiled each step
    def record_loss(self, loss: torch.Tensor, scale: Optional[float] = None) -> None:
        """One loss given to scale_loss, and the loss scale that multiplies it (a host float: no sync). Its
        time is left out of the step's (the tensor ops here cost tens of microseconds a step on a CPU, which
        would pull a sweep's speed ratios towards 1 on small steps)."""
        started = time.perf_counter()
        self.scale_loss_calls += 1
        value = loss.detach()
        if self.first_loss is None:
            self.first_loss = value
        self.last_loss = value
        if not self.keep_samples:
            return
        self._recent_losses.append(value)
        self.loss_curve.add((self.total_steps + 1, value, scale))
        if self.total_steps >= NONFINITE_GRACE_STEPS:
            bad = torch.isfinite(value).logical_not().sum()
            self._nonfinite_losses = bad if self._nonfinite_losses is None else self._nonfinite_losses + bad
        self._own_time += time.perf_counter() - started

    def record_casts(self, cache: Any) -> None:
        """Runs where a scale_loss block ends: after backward and unscaling, before the step (its time is left
        out of the step's, as record_loss's)."""
        started = time.perf_counter()
        self._record_casts(cache)
        self._own_time += time.perf_counter() - started

    def _record_casts(self, cache: Any) -> None:
        if cache.casts:
            self.iterations_with_casts += 1
            self.total_casts += cache.casts
        cache.reset_counters()
        if self._measure_state_bytes:  # now training holds the most state per parameter
            self._measure_state_bytes = False
            session = self._session() if self._session is not None else None
            if session is not None:
                optimizers = [state.optimizer for state in list(session.optimizers.values())]
                self.state_bytes_per_param = state_bytes_per_param(session.models.items(), optimizers)

    def record_step(self, skipped: bool) -> None:
        """Count one `step()` call; ends the run (StepBudgetReached) when it completes the budget."""
        if skipped:
            self.skipped_steps += 1
        else:
            self.steps += 1
        if self.keep_samples:
            self._sample_step(skipped)
        if self.max_steps is not None and self.total_steps >= self.max_steps:
            self._end_run_at_budget()

    def _sample_step(self, skipped: bool) -> None:
        step = self.total_steps
        interval = time.perf_counter() - self._last_step_end - self._own_time
        self._own_time = 0.0
        if skipped:
            self.skipped_at.add(step)
        if self.known_traps is None:
            self._find_known_traps()
        if step > self.warmup_steps and step != self.memory_probe_step:
            self.step_times.add(interval)
        if step == self.memory_probe_step - 1:
            self._start_memory_probe()
        elif step == self.memory_probe_step and self._probe is not None:
            atexit.unregister(self._end_unfinished_probe)
            self._probe.stop()
            self.peak_tensor_bytes, self.memory_note = self._probe.peak_bytes, self._probe.error
            self._probe = None
        if self.report_path and time.perf_counter() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()
        if self._gate is not None:
            self._gate.after_step(interval, step > self.warmup_steps and step != self.memory_probe_step,
                                  step >= self.warmup_steps)
        self._last_step_end = time.perf_counter()  # the bookkeeping above is not part of any step

    def _find_known_traps(self) -> None:
        session = self._session() if self._session is not None else None
        if session is not None:
            optimizers = [state.optimizer for state in list(session.optimizers.values())]
            self.known_traps = find_known_traps(session.properties, optimizers, session.dtype)

    def _start_memory_probe(self) -> None:
        self._measure_state_bytes = True
        if not cuda_in_use():
            self._probe = StepMemoryProbe()
            self._probe.start()
            atexit.register(self._end_unfinished_probe)

    def _end_unfinished_probe(self) -> None:
        """At exit inside the probed step (a script of that many steps, a step budget): torch's profiler left
        running crashes the interpreter on its way out (SIGSEGV), so it is stopped, its step unmeasured."""
        if self._probe is not None:
            self._probe.stop()
            self._probe = None
            self.memory_note = f"not measured: the run ended inside step {self.memory_probe_step}, the one measured"

    def _end_run_at_budget(self) -> None:
        self.cut_at_budget = True
        if is_rank_zero():
            log.info("apexlite: run cut at %d optimizer steps (%s=%d); exiting with status 0",
                     self.total_steps, MAX_STEPS_ENV, self.max_steps)
        self.flush()
        raise StepBudgetReached(self.total_steps)

    # --- reporting --------------------------------------------------------------------------------
    def _peak_tensor_mb(self) -> Dict[str, Any]:
        if cuda_in_use():
            return {"peak_tensor_mb": torch.cuda.max_memory_allocated() / 2 ** 20,
                    "peak_tensor_measure": "torch.cuda.max_memory_allocated over the run"}
        if self.peak_tensor_bytes is not None:
            return {"peak_tensor_mb": self.peak_tensor_bytes / 2 ** 20,
                    "peak_tensor_measure": "CPU: profiler peak of step "
                                           f"{self.memory_probe_step}"}
        return {"peak_tensor_mb": None,
                "peak_tensor_measure": self.memory_note or f"not measured: fewer than {self.memory_probe_step} steps"}

    def report(self) -> Dict[str, Any]:
        """A JSON-ready summary (floats that are not finite become None; counts say why)."""
        quartiles = self.step_times.quartiles()
        curve = [[step, _finite(_as_float(loss))] for step, loss, _ in self.loss_curve.points]
        first_bad = next((step for step, value in curve if value is None), None)
        recent = [_as_float(loss) for loss in self._recent_losses]
        return {
            "opt_level": self.opt_level,
            "dtype": self.dtype,
            "amp_enabled": self.amp_enabled,
            "device": torch.cuda.get_device_name() if cuda_in_use() else "cpu",
            "torch_threads": torch.get_num_threads(),
            "steps": self.total_steps,
            "applied_steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "skipped_at": list(self.skipped_at.points),
            "max_steps": self.max_steps,
            "cut_at_budget": self.cut_at_budget,
            "warmup_steps": self.warmup_steps,
            "measured_steps": self.step_times.seen,
            "step_time_ms": quartiles[1] * 1e3 if quartiles else None,
            "step_time_ms_iqr": (quartiles[2] - quartiles[0]) * 1e3 if quartiles else None,
            **self._peak_tensor_mb(),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "state_bytes_per_param": self.state_bytes_per_param,
            "loss_calls": self.scale_loss_calls,
            "first_loss": _finite(_as_float(self.first_loss)) if self.first_loss is not None else None,
            "final_loss": _finite(sum(recent) / len(recent)) if recent else None,
            "nonfinite_losses": int(self._nonfinite_losses) if self._nonfinite_losses is not None else 0,
            "first_nonfinite_loss_step": first_bad,
            "loss_curve": curve,
            "loss_scale_curve": [[step, scale] for step, _, scale in self.loss_curve.points],
            "loss_scale": _finite(self.loss_scale),
            "casts_per_iteration": (self.total_casts / self.iterations_with_casts
                                    if self.iterations_with_casts else 0.0),
            "known_traps": self.known_traps or [],
        }

    def flush(self) -> None:
        """Write the report to `report_path` (atomically: a reader never sees half a file)."""
        self._last_flush = time.perf_counter()
        if not self.report_path:
            return
        session = self._session() if self._session is not None else None
        if session is not None and session.loss_scalers:
            self.loss_scale = session.loss_scalers[0].loss_scale()
        partial = f"{self.report_path}.partial"
        with open(partial, "w") as handle:
            json.dump(self.report(), handle, allow_nan=False)
        os.replace(partial, self.report_path)
