"""Fail fast under overload, for exactly what the broker would refuse too, and never for long: the overload breaker.

Theory of operation
-------------------
The broker refuses a request when the work ahead of it would keep it past
its own deadline (PROTOCOL.md 6.1), and until that work drains it would
refuse that request again, and any request that waits behind at least as
much work and may wait no longer: as many items or more, a deadline as
short or shorter, the same priority or a lower one.  So the breaker keeps
the broker's **verdicts**, per key (a broker and a model)::

    Verdict(made_at=now, until=now + min(retry_after_ms, horizon), items, timeout_ms, priority)

and a request that a live verdict **covers** is refused here, at once, with
the time the verdict has left as its ``retry_after_ms``.  Everything else
goes to the broker, which alone knows: a one-text request after a refused
32-text one, a request with a longer deadline, one of higher priority.

A verdict must not outlive its evidence.  The broker's state changes with
every answer and every worker that registers, and its admission is
work-conserving (PROTOCOL.md 6.1): it admits whatever a free worker can
take at once.  A verdict held on the strength of one refusal, after that,
refuses what the broker would admit: a long ``retry_after`` from a cold
start's weak estimate once held every gateway process's traffic for its
whole length while the workers sat idle.  So:

* **Horizon.**  A verdict lasts at most ``horizon_s`` (the client's
  heartbeat interval) from the refusal that made it, whatever its
  ``retry_after_ms``.  It lasts longer only if the broker **confirms** it:
  refuses a request it covers again, which makes a new verdict.
* **Probes (half-open).**  While verdicts hold for a key, one request they
  cover goes to the broker every ``probe_every_s`` after its last refusal
  (:meth:`probe`), so the broker itself says whether there is room: a
  refusal confirms, an admission clears.
* **Admissions clear.**  An answer showing the broker admitted a request
  that a verdict covers (``ADMITTED``: any status the broker gives only to
  admitted requests), sent after that verdict was made, ends that verdict
  at once (:meth:`admitted`): what was refused is no harder than what was
  just admitted.
* A broker that dies or comes back takes its verdicts with it (:meth:`forget`).

So a verdict lasts at most one horizon past the broker's last refusal of
what it covers, and an outage of the broker's making ends for every client
within a horizon of its end, each client probing on its own.

What was taken from others, and why:

* Finagle's failure accrual marks an endpoint dead for a while, then lets
  one request through (*probe open*): its success revives the endpoint, its
  failure marks it dead again.  Taken: the probe.  Not taken: the growing
  dead time and the counting of failures: an overload verdict is the
  broker's statement about now, not a history of failures.
* Envoy's outlier detection ejects a host for ``base_ejection_time`` times
  the number of ejections, capped by ``max_ejection_time``, and the host
  returns by itself when its time is up, without a success.  Taken: the
  cap (the horizon), and the end without a success.
* gRPC's retry throttling (``retryThrottling``: ``maxTokens``,
  ``tokenRatio``) and the retry budgets of Finagle and Envoy
  (``retry_budget``: ``budget_percent``, ``min_retry_concurrency``) let
  failures take tokens and successes give them back, so successes restore
  traffic quickly.  Taken: admissions clear verdicts.  Not taken: the
  budgets themselves, which bound retries; this breaker sends no retries.
* gRPC's server pushback (``grpc-retry-pushback-ms``) delays the retries of
  the call that was pushed back, never other calls.  Taken: the broker's
  ``retry_after_ms`` is what the refused request is told; for the other
  requests it covers, the horizon bounds it.

The broker does not tell clients it has room in its replies: a new REPLY
meta key would be refused by every client older than it (PROTOCOL.md 8),
and the probes and admissions carry that news already, within a fraction of
a horizon.

A refusal without a ``retry_after_ms`` leaves no verdict: there is no
telling how long it holds.  Verdicts are few (``MAX_VERDICTS`` per key): a
new one replaces those it makes redundant, and past the count the one
ending first goes.

Plain state with an injected clock and no I/O, driven by
:class:`zbatch.client.AsyncClient`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from zbatch.protocol.wire import Status

MAX_VERDICTS = 8  # per key
HORIZON_S = 1.0  # how long one refusal may stand, unless confirmed: a heartbeat interval by default
PROBES_PER_HORIZON = 4  # requests a key lets through per horizon while verdicts hold
# Statuses the broker gives only to requests it admitted: ok and the worker's own, and those of admitted
# requests that did not finish (deadline, lost workers, no worker within the grace).
ADMITTED = frozenset({Status.OK, Status.DEADLINE_EXCEEDED, Status.WORKER_ERROR, Status.WORKER_LOST,
                      Status.NO_WORKER})


@dataclass(frozen=True, slots=True)
class Verdict:
    """At ``made_at`` the broker refused a request of ``items`` items, deadline ``timeout_ms``, at ``priority``;
    it stands until ``until``."""

    made_at: float
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
    def __init__(self, clock: Callable[[], float], horizon_s: float = HORIZON_S) -> None:
        self.clock = clock
        self.horizon_s = horizon_s
        self.probe_every_s = horizon_s / PROBES_PER_HORIZON
        self._verdicts: dict[Hashable, list[Verdict]] = {}
        self._probed_at: dict[Hashable, float] = {}

    def refusing(self, key: Hashable, items: int, timeout_ms: int, priority: int) -> int | None:
        """None if the request may go to the broker; else how many ms the verdicts covering it have left."""
        verdicts = self._verdicts.get(key)
        if not verdicts:
            return None
        now = self.clock()
        if all(v.until <= now for v in verdicts):
            self._drop(key)  # keys do not pile up after the overload
            return None
        remaining = [v.until - now for v in verdicts if v.until > now and v.covers(items, timeout_ms, priority)]
        if not remaining:
            return None
        return max(1, round(min(remaining) * 1000))

    def probe(self, key: Hashable) -> bool:
        """Whether a request that the verdicts of ``key`` cover may go to the broker now, as its probe; at most
        one every ``probe_every_s`` per key.  Ask only once the request is refused here otherwise."""
        now = self.clock()
        if now - self._probed_at.get(key, float("-inf")) < self.probe_every_s:
            return False
        self._probed_at[key] = now
        return True

    def refused(self, key: Hashable, items: int, timeout_ms: int, priority: int, retry_after_ms: int | None) -> None:
        """The broker refused such a request as ``overloaded`` and said when to retry: a verdict, or a
        confirmation of the verdicts it implies, for at most the horizon."""
        if not retry_after_ms:
            return
        now = self.clock()
        self._probed_at[key] = now  # the next probe, one interval after the broker's last word
        verdict = Verdict(now, now + min(retry_after_ms / 1000, self.horizon_s), items, timeout_ms, priority)
        kept = [v for v in self._verdicts.get(key, ()) if v.until > now and not verdict.implies(v)]
        if any(v.implies(verdict) for v in kept):
            return
        kept.append(verdict)
        if len(kept) > MAX_VERDICTS:
            kept.remove(min(kept, key=lambda v: v.until))
        self._verdicts[key] = kept

    def admitted(self, key: Hashable, items: int, timeout_ms: int, priority: int, sent_at: float) -> None:
        """The broker admitted such a request, sent at ``sent_at``: the verdicts made before then that cover it
        are stale."""
        verdicts = self._verdicts.get(key)
        if not verdicts:
            return
        kept = [v for v in verdicts if not (v.made_at <= sent_at and v.covers(items, timeout_ms, priority))]
        if kept:
            self._verdicts[key] = kept
        else:
            self._drop(key)

    def forget(self, stale: Callable[[Hashable], bool]) -> None:
        """Drop the verdicts of the keys ``stale`` picks (say, every model of a broker that died)."""
        for key in [key for key in self._verdicts if stale(key)]:
            self._drop(key)

    def verdicts(self, key: Hashable) -> list[Verdict]:
        """The live verdicts for ``key`` (for tests and statistics)."""
        now = self.clock()
        return [v for v in self._verdicts.get(key, ()) if v.until > now]

    def _drop(self, key: Hashable) -> None:
        self._verdicts.pop(key, None)
        self._probed_at.pop(key, None)
