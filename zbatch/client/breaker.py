"""Fail fast under overload: after the broker refuses a model, refuse here while one request asks it again.

Theory of operation
-------------------
When the broker answers "overloaded" for a model, the next requests for it
would almost all be refused too, each after a round trip through the broker.
Under a flood that round trip is most of the refusal's cost and latency.  So
the client keeps a small circuit breaker per (model, priority)::

    CLOSED --an "overloaded" answer--> OPEN --next request is sent as the probe--> PROBING
      ^                                  ^                                            |
      |                                  +---------- the probe: "overloaded" ---------+
      +--------------------- the probe: any other outcome ---------------------------+

* CLOSED: every request goes to the broker.
* OPEN: the next request goes to the broker as the probe.
* PROBING: requests are refused here, at once, until the probe's answer comes.

The breaker never holds a request back longer than one broker round trip
behind the broker's own verdict, and has no time constant to tune: as soon
as the backlog has room, the probe is admitted and the breaker closes.  A
probe that ends any other way (an error, a timeout, the caller giving up)
closes it too, so it can never stick.  Priorities are separate keys: a flood
of low-priority requests never gets high-priority ones refused here.

Plain state with no I/O, driven by :class:`zbatch.client.AsyncClient`.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable


class Ticket(enum.Enum):
    """How a request may go: to the broker as usual, or as the probe of an open breaker."""

    NORMAL = "normal"
    PROBE = "probe"


class OverloadBreaker:
    def __init__(self) -> None:
        # Absent: closed.  False: open, the next request is the probe.  True: the probe is out.
        self._probe_out: dict[Hashable, bool] = {}
        self.retry_after_ms: dict[Hashable, int | None] = {}  # the broker's last hint, for local refusals

    def admit(self, key: Hashable) -> Ticket | None:
        """How the next request for ``key`` may go; None: refuse it here."""
        probe_out = self._probe_out.get(key)
        if probe_out is None:
            return Ticket.NORMAL
        if probe_out:
            return None
        self._probe_out[key] = True
        return Ticket.PROBE

    def settle(self, key: Hashable, ticket: Ticket, overloaded: bool, retry_after_ms: int | None = None) -> None:
        """Record how a request sent with ``ticket`` ended: refused as overloaded, or anything else."""
        if overloaded:
            self.retry_after_ms[key] = retry_after_ms
            if ticket is Ticket.PROBE or key not in self._probe_out:
                self._probe_out[key] = False  # open: the next request probes
        elif ticket is Ticket.PROBE:
            self._probe_out.pop(key, None)  # closed: the broker took it, or it ended some other way
            self.retry_after_ms.pop(key, None)

    def is_closed(self, key: Hashable) -> bool:
        return key not in self._probe_out
