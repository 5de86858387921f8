"""When to run the next batch: a pure, clock-injected policy.

Theory of operation
-------------------
Items wait in the worker until the model is free.  When it is, the policy
answers one question: run what is pending now, or wait a little for more?

1. A batch is cut at ``max_batch_size`` items, at once.
2. Otherwise the batch has ONE deadline, a window after it could first
   start: its oldest item's arrival on an idle model, or the moment the model
   freed for items that queued behind a busy one.  Later arrivals never push
   the deadline back, so a steady trickle cannot postpone a batch forever.
3. The window opens when the model frees, not when the first queued item
   arrived: closed-loop clients whose answers just left need one round trip to
   send again, and a window counted from an older arrival would run the early
   ones alone and lock the clients into alternating small and large batches.
4. Waiting only pays if more items will come within the window.  The policy
   estimates the recent rate of *concurrent* arrivals, items that came while
   the worker already held others of this model; if fewer than
   ``WAIT_THRESHOLD`` more are expected before the deadline, it runs now.  A
   lone closed-loop client never counts (its requests always find the worker
   empty), so it never waits, however fast it sends.
5. The window is ``min(max_delay, fixed)``, where ``fixed`` is the model's
   fixed cost per batch: idling the model for ``w`` to merge the next items
   costs ``w``, while running now and those items as a batch of their own
   costs one more fixed cost, so waiting longer than ``fixed`` never pays.
   ``fixed`` is fitted as ``time = fixed + per_item * items`` through the
   recent time of each batch size (:class:`BatchCost`); until batches of two
   sizes have run, the window is ``max_delay``.  The fit changes only when a
   batch ends, which starts a new window, so each batch keeps its one deadline.
6. ``max_delay == 0`` means never wait.
7. Answered clients come back.  A closed-loop client sends its next request
   as soon as it has its answer, so when a batch ends, the items of the
   requests it answered are expected again (:class:`Returns`), one round trip
   later, and the next batch waits for them instead of guessing from the rate
   (rules 4 and 5, which do not apply while returns are expected).  It runs as
   soon as as many items have arrived since the model freed as the last batch
   answered, so nobody waits for a client that is already there: a lone
   client's request is its own return and runs at once.  Clients that do not
   come back (they went to another worker, or they were not in a loop) cost
   at most the return time: the slowest recent return, measured from the
   model freeing, and never more than ``RETURN_SHARE`` of the time the last
   batch took, so a batch idles the model at most that share of its own run.
   The round trip of answered clients through a gateway is many times the
   model's fixed cost per batch, so without this rule the first returns ran
   as a small batch while the rest queued behind it, and the two alternated
   for good (one of 1 and one of 7 for eight clients).  The return deadline is
   set when the batch ends, so it too is one deadline that arrivals never move.

``python -m scripts.benchmarks.studies.delay`` measures these rules on a simulated
accelerator behind the real broker and worker; BENCHMARKS.md keeps the figures.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WAIT_THRESHOLD = 0.5
RATE_HORIZON_S = 1.0
COST_SMOOTHING = 0.1  # weight of a batch's time in its size's moving average
COST_MIN_BATCHES = 8  # before the cost fit is trusted
RETURN_SHARE = 0.25  # longest wait for answered clients, as a share of the last batch's time
RETURN_HISTORY = 8  # batches whose slowest return sets the return time


@dataclass(slots=True)
class ArrivalRate:
    """Items per second over the last ``horizon_s`` seconds."""

    horizon_s: float = RATE_HORIZON_S
    _arrivals: deque[tuple[float, int]] = field(default_factory=deque)
    _items: int = 0

    def record(self, now: float, items: int) -> None:
        self._arrivals.append((now, items))
        self._items += items
        self._forget_before(now - self.horizon_s)

    def per_second(self, now: float) -> float:
        self._forget_before(now - self.horizon_s)
        return self._items / self.horizon_s

    def _forget_before(self, cutoff: float) -> None:
        while self._arrivals and self._arrivals[0][0] < cutoff:
            self._items -= self._arrivals.popleft()[1]


@dataclass(slots=True)
class BatchCost:
    """The model's time per batch, fitted as ``fixed + per_item * items``.

    Each batch size keeps a moving average of its time, and the line is fitted
    through the sizes seen.  Traffic in a steady state runs one size over and
    over (closed-loop clients: all 8, or all 32), so a fit over only the
    latest batches would lose what a batch of 1 costs; averaging per size keeps it.
    """

    fixed_s: float | None = None  # None until batches of at least two sizes have run
    _mean_s: dict[int, float] = field(default_factory=dict)
    _batches: int = 0

    def record(self, items: int, seconds: float) -> None:
        previous = self._mean_s.get(items)
        self._mean_s[items] = seconds if previous is None else previous + COST_SMOOTHING * (seconds - previous)
        self._batches += 1
        if self._batches >= COST_MIN_BATCHES and len(self._mean_s) >= 2:
            self.fixed_s = self._fit()

    def _fit(self) -> float:
        sizes = self._mean_s.items()
        mean_items = sum(items for items, _ in sizes) / len(sizes)
        mean_s = sum(seconds for _, seconds in sizes) / len(sizes)
        spread = sum((items - mean_items) ** 2 for items, _ in sizes)
        per_item = sum((items - mean_items) * (seconds - mean_s) for items, seconds in sizes) / spread
        if per_item <= 0:  # size costs nothing measurable: the whole batch time is fixed
            return mean_s
        return max(0.0, mean_s - per_item * mean_items)


@dataclass(slots=True)
class Returns:
    """The clients the last batch answered, expected back before its return deadline (rule 7)."""

    answered: int = 0  # items of the requests the last batch answered
    expected: int = 0  # how many of them are still to come back
    freed_at: float = 0.0
    deadline: float = float("-inf")  # no wait for returns after it
    _latest: float | None = None  # lag of the latest return of the last batch, from freed_at
    _slowest: deque[float] = field(default_factory=lambda: deque(maxlen=RETURN_HISTORY))

    def answered_at(self, now: float, items: int, batch_seconds: float) -> None:
        """A batch that took ``batch_seconds`` ended at ``now``, answering requests of ``items`` items."""
        if self._latest is not None:
            self._slowest.append(self._latest)
        self._latest = None
        self.answered = self.expected = items
        self.freed_at = now
        cap = RETURN_SHARE * batch_seconds
        self.deadline = now + (min(cap, max(self._slowest)) if self._slowest else cap)

    def arrived(self, now: float, items: int) -> None:
        """Arrivals count as returns until the next batch ends, late ones too: they teach the return time."""
        if self.expected > 0:
            self.expected = max(0, self.expected - items)
            self._latest = now - self.freed_at

    def covers(self, first_arrival: float) -> bool:
        """Whether a batch whose oldest item came at ``first_arrival`` is the one answered clients return to."""
        return self.answered > 0 and first_arrival < self.deadline

    def waiting_until(self, now: float) -> float | None:
        """The return deadline while answered clients are still expected before it; else None."""
        return self.deadline if self.expected > 0 and now < self.deadline else None


@dataclass(slots=True)
class BatchPolicy:
    max_batch_size: int
    max_delay_s: float
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    cost: BatchCost = field(default_factory=BatchCost)
    returns: Returns = field(default_factory=Returns)

    @property
    def window_s(self) -> float:
        """How long a batch may wait for more items: ``max_delay``, or the batch's fixed cost if shorter."""
        fixed = self.cost.fixed_s
        return self.max_delay_s if fixed is None else min(self.max_delay_s, fixed)

    def arrived(self, now: float, items: int, others_held: bool) -> None:
        """``others_held``: the worker held other items of this model when these came, so they are concurrent."""
        if others_held:
            self.rate.record(now, items)
        self.returns.arrived(now, items)

    def ran(self, items: int, seconds: float, answered: int = 0, now: float | None = None) -> None:
        """A batch of ``items`` took the model ``seconds``; ending at ``now``, it answered requests of
        ``answered`` items, whose clients may send again (rule 7)."""
        self.cost.record(items, seconds)
        if now is not None:
            self.returns.answered_at(now, answered, seconds)

    def run_at(self, now: float, pending: int, first_arrival: float, idle_since: float) -> float | None:
        """When to start the next batch on a free model (``<= now``: at once); None if nothing is pending."""
        if pending == 0:
            return None
        window = self.window_s
        if pending >= self.max_batch_size or self.max_delay_s <= 0:
            return now
        if self.returns.covers(first_arrival):  # rule 7: answered clients are coming back, or all came
            return self.returns.waiting_until(now) or now
        if window <= 0:
            return now
        deadline = max(first_arrival, idle_since) + window
        if now >= deadline:
            return now
        expected_more = self.rate.per_second(now) * (deadline - now)
        return deadline if expected_more >= WAIT_THRESHOLD else now
