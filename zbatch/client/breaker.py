"""Fail fast under overload, for exactly what the broker would refuse too: the client's overload breaker.

Theory of operation
-------------------
The broker refuses a request when the work ahead of it would keep it past
its own deadline (PROTOCOL.md 6.1), and its ``retry_after_ms`` says when
room for it is expected.  Until then the broker would refuse that request
again, and any request that waits behind at least as much work and may
wait no longer: as many items or more, a deadline as short or shorter, the
same priority or a lower one.  So the breaker keeps the broker's
**verdicts**, per (broker, model)::

    Verdict(until=now + retry_after_ms, items, timeout_ms, priority)

and a request that a live verdict **covers** is refused here, at once, with
the time the verdict has left as its ``retry_after_ms``.  Everything else
goes to the broker, which alone knows: a one-text request after a refused
32-text one, a request with a longer deadline, one of higher priority.  So
the breaker never refuses what the broker would admit, as far as the
broker's own answer tells, and under a flood most refusals cost no round
trip.

A verdict ends by itself when its time is up; there is no probe to send and
no state to close, so the breaker cannot stick.  A refusal without a
``retry_after_ms`` leaves no verdict: there is no telling how long it holds.
Verdicts are few (``MAX_VERDICTS`` per key): a new one replaces those it
makes redundant, and past the count the one ending first goes.

Plain state with an injected clock and no I/O, driven by
:class:`zbatch.client.AsyncClient`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

MAX_VERDICTS = 8  # per (broker, model)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The broker refused a request of ``items`` items, deadline ``timeout_ms``, at ``priority``, until ``until``."""

    until: float
    items: int
    timeout_ms: int
    priority: int

    def covers(self, items: int, timeout_ms: int, priority: int) -> bool:
        """Whether a request like this one would be refused too: no smaller, no more patient, no more urgent."""
        return items >= self.items and timeout_ms <= self.timeout_ms and priority >= self.priority

    def implies(self, other: Verdict) -> bool:
        """Whether this verdict covers every request ``other`` does, for at least as long."""
        return self.covers(other.items, other.timeout_ms, other.priority) and self.until >= other.until


class OverloadBreaker:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._verdicts: dict[Hashable, list[Verdict]] = {}

    def refusing(self, key: Hashable, items: int, timeout_ms: int, priority: int) -> int | None:
        """None if the request may go to the broker; else how many ms until the broker expects room for it."""
        verdicts = self._verdicts.get(key)
        if not verdicts:
            return None
        now = self.clock()
        if all(v.until <= now for v in verdicts):
            del self._verdicts[key]  # keys do not pile up after the overload
            return None
        remaining = [v.until - now for v in verdicts if v.until > now and v.covers(items, timeout_ms, priority)]
        if not remaining:
            return None
        return max(1, round(min(remaining) * 1000))

    def refused(self, key: Hashable, items: int, timeout_ms: int, priority: int, retry_after_ms: int | None) -> None:
        """The broker refused such a request as ``overloaded`` and said when to retry."""
        if not retry_after_ms:
            return
        now = self.clock()
        verdict = Verdict(now + retry_after_ms / 1000, items, timeout_ms, priority)
        kept = [v for v in self._verdicts.get(key, ()) if v.until > now and not verdict.implies(v)]
        if any(v.implies(verdict) for v in kept):
            return
        kept.append(verdict)
        if len(kept) > MAX_VERDICTS:
            kept.remove(min(kept, key=lambda v: v.until))
        self._verdicts[key] = kept

    def verdicts(self, key: Hashable) -> list[Verdict]:
        """The live verdicts for ``key`` (for tests and statistics)."""
        now = self.clock()
        return [v for v in self._verdicts.get(key, ()) if v.until > now]
