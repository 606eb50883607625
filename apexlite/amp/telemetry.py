"""RunStats: what apexlite itself observed during a run (steps, losses, skips, casts, step time).

Counters are always kept (they cost a few integer updates per step). Losses are kept as detached
device tensors and turned into floats only when a report is written, so recording never syncs.
When the environment variable APEXLITE_TELEMETRY names a file, the last session's report is
written there as JSON at process exit; `apexlite sweep` uses this to compare runs.
"""
from __future__ import annotations

import atexit
import json
import os
import resource
import statistics
import time
from typing import Any, Dict, List, Optional

import torch

TELEMETRY_ENV = "APEXLITE_TELEMETRY"


def peak_memory_mb() -> float:
    """Peak memory of this process: CUDA allocator peak when CUDA is in use, else max RSS."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class RunStats:
    """Counters and samples for one session."""

    def __init__(self, keep_samples: bool = False) -> None:
        self.keep_samples = keep_samples  # full loss curve and step times (for sweeps)
        self.scale_loss_calls = 0
        self.steps = 0
        self.skipped_steps = 0
        self.iterations_with_casts = 0
        self.total_casts = 0
        self.first_loss: Optional[torch.Tensor] = None
        self.last_loss: Optional[torch.Tensor] = None
        self.losses: List[torch.Tensor] = []
        self.step_times: List[float] = []
        self._last_step_end: Optional[float] = None
        self.opt_level: Optional[str] = None
        self.dtype: Optional[str] = None
        self.loss_scale: Optional[float] = None

    def record_loss(self, loss: torch.Tensor) -> None:
        self.scale_loss_calls += 1
        value = loss.detach()
        if self.first_loss is None:
            self.first_loss = value
        self.last_loss = value
        if self.keep_samples:
            self.losses.append(value)

    def record_casts(self, cache: Any) -> None:
        if cache.casts:
            self.iterations_with_casts += 1
            self.total_casts += cache.casts
        cache.reset_counters()

    def record_step(self, skipped: bool) -> None:
        if self.keep_samples:
            now = time.perf_counter()
            if self._last_step_end is not None:
                self.step_times.append(now - self._last_step_end)
            self._last_step_end = now
        if skipped:
            self.skipped_steps += 1
        else:
            self.steps += 1

    def report(self) -> Dict[str, Any]:
        """A JSON-ready summary."""
        losses = [float(x.float().mean()) for x in self.losses]
        first = float(self.first_loss.float().mean()) if self.first_loss is not None else None
        last = float(self.last_loss.float().mean()) if self.last_loss is not None else None
        return {
            "opt_level": self.opt_level,
            "dtype": self.dtype,
            "steps": self.steps + self.skipped_steps,
            "applied_steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "step_time_ms": statistics.median(self.step_times) * 1e3 if self.step_times else None,
            "peak_memory_mb": peak_memory_mb(),
            "first_loss": first,
            "final_loss": last,
            "losses": losses,
            "loss_scale": self.loss_scale,
            "casts_per_iteration": (self.total_casts / self.iterations_with_casts
                                    if self.iterations_with_casts else 0.0),
        }


def telemetry_requested() -> bool:
    """True when this process should keep samples and write a report at exit."""
    return bool(os.environ.get(TELEMETRY_ENV))


class _TelemetryWriter:
    """Writes the most recent session's report to $APEXLITE_TELEMETRY at exit."""

    latest: Optional[Any] = None
    registered = False

    @classmethod
    def track(cls, session: Any) -> None:
        if not os.environ.get(TELEMETRY_ENV):
            return
        cls.latest = session
        if not cls.registered:
            atexit.register(cls.write)
            cls.registered = True

    @classmethod
    def write(cls) -> None:
        path = os.environ.get(TELEMETRY_ENV)
        session = cls.latest
        if not path or session is None:
            return
        session.stats.loss_scale = session.loss_scalers[0].loss_scale() if session.loss_scalers else None
        with open(path, "w") as handle:
            json.dump(session.stats.report(), handle)


track_session = _TelemetryWriter.track
