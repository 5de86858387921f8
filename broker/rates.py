"""A model's service rate: the items a worker runs per second of its busy time, from its heartbeats.

Theory of operation
-------------------
A worker's heartbeat carries, per model, cumulative counters (PROTOCOL.md
3.7): the items its batches ran and ``busy_ms``, the time those batches took.
Between two heartbeats the broker takes the differences, and keeps two sums
that decay by ``exp(-busy / WINDOW_S)``: items, and busy seconds.  Their
ratio is the worker's rate for the model, weighted towards its last
``WINDOW_S`` seconds of work, so it follows the model as inputs or the
host's contention change, and stands still while the worker idles.

Busy time, not items answered per second of the clock: a worker that idles
between small batches answers what it is sent, which measures the load, not
what the worker could do.  Busy time measures the worker whatever the load.
A batch of one costs more per item than a full batch, so a rate measured at
light load is lower than the full-batch rate: an error on the safe side,
which full batches correct within ``WINDOW_S`` of busy time.

A worker of several brokers (PROTOCOL.md 6.6) spends its busy time on all of
them.  For such a worker the rate is scaled by this broker's part of the
items it ran (the items of this broker's ``ok`` replies over the worker's
items), so that each broker counts only the part of the worker it gets.
That part is measured: while this broker sends little it is small and the
rate conservative; under this broker's overload it is the part this broker
actually gets.

The first heartbeat of a registration only sets the baseline: what the
worker ran before this broker knew it (its warm-up, another broker's work)
says nothing of the work it does for this one.  A rate is known from the
second heartbeat that shows busy time, about one heartbeat interval into a
model's first load; until then admission counts items (:mod:`broker.admission`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbatch.protocol.wire import BatchCounters

WINDOW_S = 5.0  # busy seconds over which old measurements fade (by 1/e)
MIN_ITEMS = 1.0  # fewer items than this in the sums (decayed) is no measurement yet


@dataclass(slots=True)
class ServiceRate:
    """One worker's rate for one model, from its heartbeats' counters and this broker's own answers."""

    items: float = 0.0  # the worker's items, decayed
    busy_s: float = 0.0  # its busy seconds, decayed alike
    mine: float = 0.0  # the items of this broker's ok replies from it, decayed alike
    answered: int = 0  # items of this broker's ok replies since the last heartbeat
    baseline: BatchCounters | None = None  # the counters of the last heartbeat

    def answered_ok(self, items: int) -> None:
        self.answered += items

    def heartbeat(self, counters: BatchCounters) -> None:
        """Take the differences from the last heartbeat's counters; a worker whose counters went back
        (they are cumulative, so it restarted) starts a new baseline."""
        last, self.baseline = self.baseline, counters
        answered, self.answered = self.answered, 0
        if last is None or counters.busy_ms < last.busy_ms or counters.items < last.items:
            return
        busy_s = (counters.busy_ms - last.busy_ms) / 1000
        fade = math.exp(-busy_s / WINDOW_S)
        self.items = self.items * fade + (counters.items - last.items)
        self.busy_s = self.busy_s * fade + busy_s
        self.mine = self.mine * fade + answered

    def per_second(self, shared: bool) -> float | None:
        """Items per second this broker can count on, or None before there is a measurement.

        ``shared``: the worker serves several brokers, and this one gets only its part of it.
        """
        if self.busy_s <= 0 or self.items < MIN_ITEMS:
            return None
        rate = self.items / self.busy_s
        if not shared:
            return rate
        if self.mine < MIN_ITEMS:
            return None
        return rate * min(1.0, self.mine / self.items)
