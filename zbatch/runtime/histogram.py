"""A fixed-bucket histogram in plain Python, for the daemons' hot paths.

The broker core and the worker loop record timings and sizes here without
importing prometheus_client (the core stays sans-I/O and dependency-free);
their metrics shells turn a :class:`Histogram` into Prometheus samples on
scrape.  ``observe`` is one bisect and two additions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

# Queue and inference times: 1 ms to a minute (the longest deadline a client may ask for).
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Batch sizes, in items: fine enough below the default cap of 32 to tell 31 + 1 from 16 + 16.
SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 28, 31, 32, 48, 64, 128, 256)


@dataclass(slots=True)
class Histogram:
    """Counts of observations at or below each upper bound (not cumulative), plus their sum.

    ``counts`` has one more slot than ``bounds``: values above the last bound.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus ``le`` buckets: (upper bound as text, observations at or below it), ending in +Inf."""
        labels: Sequence[str] = [*(_bound_text(b) for b in self.bounds), "+Inf"]
        running, buckets = 0, []
        for label, count in zip(labels, self.counts, strict=True):
            running += count
            buckets.append((label, running))
        return buckets


def _bound_text(bound: float) -> str:
    return repr(float(bound))
