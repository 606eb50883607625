"""Fixed-size summaries of unbounded streams, so a run's telemetry costs the same memory at any length."""
from __future__ import annotations

import random
import statistics
from typing import Any, List, Optional, Tuple


class Reservoir:
    """A uniform random sample of at most `capacity` values of a stream (all of them while they fit).

    Its median and quartiles estimate the stream's; they are exact until the stream outgrows the
    reservoir. The generator is seeded, so the same stream always gives the same sample.
    """

    def __init__(self, capacity: int = 4096, seed: int = 0) -> None:
        self.capacity = capacity
        self.values: List[float] = []
        self.seen = 0
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.capacity:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)  # keeps each of the `seen` values with equal chance
        if slot < self.capacity:
            self.values[slot] = value

    def quartiles(self) -> Optional[Tuple[float, float, float]]:
        """(first quartile, median, third quartile) of the sample; None when it is empty."""
        if not self.values:
            return None
        if len(self.values) == 1:
            return (self.values[0],) * 3
        q1, median, q3 = statistics.quantiles(self.values, n=4, method="inclusive")
        return q1, median, q3


class DownsampledCurve:
    """At most `capacity` points spread evenly over a whole stream, oldest to newest.

    When it fills up, every other point is dropped and from then on only every 2nd (4th, ...) new
    point is kept, so the first point stays and the spacing stays even however long the stream is.
    """

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {capacity}")
        self.capacity = capacity
        self.points: List[Any] = []
        self.stride = 1
        self.seen = 0

    def add(self, point: Any) -> None:
        if self.seen % self.stride == 0:
            self.points.append(point)
            if len(self.points) == self.capacity:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1
