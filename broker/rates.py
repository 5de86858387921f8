"""A model's service rate: the items a worker runs per second of the time it spends on them, from its heartbeats.

Theory of operation
-------------------
A worker's heartbeat carries, per model, cumulative counters (PROTOCOL.md
3.7): the items its batches ran and ``busy_ms``, the time those batches took.
Between two heartbeats the broker takes the differences, items and busy
time, and keeps their sums, fading by ``exp(-time / WINDOW_S)``: their ratio
is the worker's rate for the model, weighted towards its last ``WINDOW_S``
seconds of work, so it follows the model as inputs or the host's contention
change, and stands still while the worker idles.  Busy time, not answered
items per second of the clock, which would measure the load rather than
the worker.

Busy time does not count the gaps between batches (the worker's own event
loop, its tokenizing, other processes on the host taking the cores), so it
overstates what a worker does when it is kept busy, and most where it
matters: on a host whose cores the load itself takes.  So while the model's
backlog at the broker has not emptied since the last heartbeat
(``saturated``), the worker always had its next batch, and the whole
interval between the two heartbeats is what its items cost: those items and
that time go into two more sums, and the rate is the lower of the two
ratios once those sums hold ``MIN_SATURATED_BATCHES`` batches: a batch
that takes longer than a heartbeat interval makes single intervals of 0
items or of two batches, and only several batches average that out.

A worker of several brokers (PROTOCOL.md 6.6) spends its time on all of
them.  For such a worker the rate is scaled by this broker's part of the
items it ran (the items of this broker's ``ok`` replies over the worker's
items), so that each broker counts only the part of the worker it gets.
That part is measured: while this broker sends little it is small and the
rate conservative; under this broker's overload it is the part this broker
actually gets.  It follows the other brokers within a few seconds of work
(``PART_WINDOW_S``), faster than the rate itself: when another broker dies
its part comes to this one as soon as the worker gives it up (PROTOCOL.md
6.6), and a broker that comes back takes its part again at once, so neither
the survivor's refusals nor its admissions lag behind a restart.

The first heartbeat of a registration only sets the baseline: what the
worker ran before this broker knew it (its warm-up, another broker's work)
says nothing of the work it does for this one.

**Evidence.**  A measurement is a ratio from the second heartbeat that
shows work on, but a rate may refuse requests (beyond the cold count of
:mod:`broker.admission`) only once it is **established**: built from at
least ``MIN_INTERVALS`` heartbeat intervals that showed work, holding at
least ``MIN_BATCHES`` batches or ``MIN_BUSY_S`` seconds of them.  One
interval, or a few batches, is one sample of a worker's first moments: a
first batch that ran slow (a shape its warm-up missed, a device that
idled) once made a single batch of a few items the whole rate, a
thousandth of the worker's, and a predicted wait of minutes out of a
fraction of a second of work (tests/broker/test_cold_start.py).
Several batches over two intervals outweigh one such batch; a model slow
enough to run fewer batches is established by their busy time instead.
Until then the estimate is **weak**: admission counts items, as before any
measurement, and a refusal's ``retry_after`` is one heartbeat interval,
when the evidence may have grown.  A worker whose own rate is not
established counts at the mean of those that are (:meth:`broker.state.ModelState.measure_rate`).

What the rate does not see (the batch a request waits to join, the hops to
and from the worker, a change of pace since the last heartbeat) makes
answers come later than the work ahead predicts.  :class:`Lateness` keeps
how much later, from the answers themselves: the broker adds it to every
predicted wait, so the deadline the prediction is held to is the deadline
the caller sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zbatch.protocol.wire import BatchCounters

WINDOW_S = 10.0  # seconds of work over which old measurements fade (by 1/e)
LATENESS_WINDOW_S = 30.0  # seconds over which a late answer stops weighing on the predictions (by 1/e)
MIN_ITEMS = 1.0  # fewer items than this in the sums (faded) is no measurement yet
MIN_SATURATED_BATCHES = 4.0  # saturated batches (faded) below which the busy-time rate stands alone
PART_WINDOW_S = 2.0  # seconds of work over which a worker of several brokers' part for this one fades (by 1/e)
MIN_INTERVALS = 2  # heartbeat intervals showing work before a rate may refuse
MIN_BATCHES = 8  # and batches in them, or
MIN_BUSY_S = 2.0  # seconds of their busy time (a slow model's few long batches)


@dataclass(slots=True)
class ServiceRate:
    """One worker's rate for one model, from its heartbeats' counters and this broker's own answers."""

    items: float = 0.0  # the worker's items, faded
    seconds: float = 0.0  # its busy time, faded alike
    saturated_items: float = 0.0  # its items of saturated intervals, faded alike
    saturated_batches: float = 0.0  # and its batches
    saturated_s: float = 0.0  # the length of those intervals, faded alike
    mine: float = 0.0  # the items of this broker's ok replies from it, faded over PART_WINDOW_S
    all_items: float = 0.0  # and the worker's items, faded alike: mine / all_items is this broker's part
    answered: int = 0  # items of this broker's ok replies since the last heartbeat
    baseline: BatchCounters | None = None  # the counters of the last heartbeat
    at: float = 0.0  # when the last heartbeat came
    intervals: int = 0  # heartbeat intervals that showed work, counted up to MIN_INTERVALS
    batches: int = 0  # the batches they held, counted up to MIN_BATCHES
    busy_s: float = 0.0  # and their busy time, counted up to MIN_BUSY_S

    def answered_ok(self, items: int) -> None:
        self.answered += items

    def heartbeat(self, counters: BatchCounters, now: float, backlogged_since: float | None) -> None:
        """Take the differences from the last heartbeat's counters; ``backlogged_since``: since when the model
        has had items waiting at the broker without a break (None: none wait now).  A worker whose counters
        went back (they are cumulative, so it restarted) starts a new baseline."""
        last, self.baseline = self.baseline, counters
        answered, self.answered = self.answered, 0
        last_at, self.at = self.at, now
        if last is None or counters.busy_ms < last.busy_ms or counters.items < last.items:
            return
        items, busy_s = counters.items - last.items, (counters.busy_ms - last.busy_ms) / 1000
        saturated_s = now - last_at if backlogged_since is not None and backlogged_since <= last_at else 0.0
        elapsed = max(busy_s, saturated_s)
        if elapsed <= 0:
            return  # no time to divide by (a worker that reports no busy time, not saturated)
        fade = math.exp(-elapsed / WINDOW_S)
        self.items = self.items * fade + (items if busy_s > 0 else 0)
        self.seconds = self.seconds * fade + busy_s
        self.saturated_items = self.saturated_items * fade + (items if saturated_s > 0 else 0)
        batches = counters.batches - last.batches if saturated_s > 0 else 0
        self.saturated_batches = self.saturated_batches * fade + batches
        self.saturated_s = self.saturated_s * fade + saturated_s
        part_fade = math.exp(-elapsed / PART_WINDOW_S)
        self.mine = self.mine * part_fade + answered
        self.all_items = self.all_items * part_fade + items
        if items > 0:
            self.intervals = min(MIN_INTERVALS, self.intervals + 1)
            self.batches = min(MIN_BATCHES, self.batches + max(0, counters.batches - last.batches))
            self.busy_s = min(MIN_BUSY_S, self.busy_s + busy_s)

    @property
    def established(self) -> bool:
        """Whether the measurement is evidence enough to refuse with (the module's docstring)."""
        return self.intervals >= MIN_INTERVALS and (self.batches >= MIN_BATCHES or self.busy_s >= MIN_BUSY_S)

    def per_second(self, shared: bool) -> float | None:
        """Items per second this broker can count on, or None before there is a measurement.

        ``shared``: the worker serves several brokers, and this one gets only its part of it.
        """
        rate: float | None = None
        if self.seconds > 0 and self.items >= MIN_ITEMS:
            rate = self.items / self.seconds
        if self.saturated_batches >= MIN_SATURATED_BATCHES and self.saturated_s > 0:
            saturated = self.saturated_items / self.saturated_s
            rate = saturated if rate is None else min(rate, saturated)
        if rate is None:
            return None
        if not shared:
            return rate
        if self.mine < MIN_ITEMS or self.all_items <= 0:
            return None
        return rate * min(1.0, self.mine / self.all_items)


@dataclass(slots=True)
class Lateness:
    """How much later than predicted a model's answers come: the largest lateness seen, fading with time.

    A maximum, not a mean: a prediction that is right on average is late for half the requests at the
    margin.  It fades slowly (``LATENESS_WINDOW_S``) because a host's pace swings back and forth: a
    lateness forgotten between two swings lets the next one make admitted requests late (BENCHMARKS.md,
    Shedding by time).
    """

    seconds: float = 0.0
    at: float = 0.0

    def observe(self, late_s: float, now: float) -> None:
        self.seconds = max(late_s, self.now(now))
        self.at = now

    def now(self, now: float) -> float:
        if self.seconds <= 0:
            return 0.0
        return self.seconds * math.exp(-(now - self.at) / LATENESS_WINDOW_S)
