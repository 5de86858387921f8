"""Which broker gets the next request, and which brokers are alive: the client's view of several brokers.

Theory of operation
-------------------
A client of several brokers (PROTOCOL.md 6.6) keeps, per broker, whether it
is live, when it last heard from it, and how many items it has outstanding
there.  Plain state with an injected clock and no sockets, driven by
:class:`zbatch.client.AsyncClient`::

    LIVE --silent for interval x liveness, or its connection drops--> DEAD
      ^                                                                 |
      +------------- any message from it (a HEARTBEAT answer) ----------+

* Every broker, live or dead, is sent a HEARTBEAT every interval
  (:meth:`BrokerSet.heartbeat_due`): the answers keep the live ones live and
  bring the dead ones back.
* :meth:`BrokerSet.order` lists the live brokers, fewest outstanding items
  first; ties go in turn, so an idle client still spreads its requests.
* A broker's requests are moved elsewhere when it dies (the client does the
  moving); :attr:`Broker.moved_away` remembers their ids, so the broker can be
  told to cancel them when it comes back.

A client of one broker does not use liveness (``watch=False``): it has nowhere
else to send, and a hung broker that resumes still answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_MOVED_AWAY = 100_000  # ids to cancel at a broker when it comes back; past this, its deadlines clean up


@dataclass(slots=True)
class Broker:
    endpoint: str
    last_heard: float
    live: bool = True
    outstanding: int = 0  # items sent there and not answered yet
    moved_away: set[bytes] = field(default_factory=set)
    deaths: int = 0
    died_at: float = 0.0  # when it was last given up
    why: str = ""  # and why, with the silence measured then

    def obituary(self, now: float) -> str:
        """Why and when it was given up, for the errors of what it had: the measured silence, which is the
        liveness plus however late this client's own clock noticed it (a loaded host delays that)."""
        return f"was given up {now - self.died_at:.2f} s ago, {self.why}"


class BrokerSet:
    """The brokers of one client, by index; ``watch`` turns liveness on (several brokers)."""

    def __init__(self, endpoints: Sequence[str], clock: Callable[[], float], *, heartbeat_s: float = 1.0,
                 liveness: int = 3, watch: bool | None = None) -> None:
        self.clock = clock
        now = clock()
        self.brokers = [Broker(endpoint, now) for endpoint in endpoints]
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.watch = len(self.brokers) > 1 if watch is None else watch
        self._turn = 0
        self._next_beat = now

    def __getitem__(self, index: int) -> Broker:
        return self.brokers[index]

    def __len__(self) -> int:
        return len(self.brokers)

    @property
    def expiry_s(self) -> float:
        return self.heartbeat_s * self.liveness

    def restart(self) -> None:
        """Reading starts (again): silence is counted from now, and a heartbeat is due at once."""
        now = self.clock()
        for broker in self.brokers:
            broker.last_heard = max(broker.last_heard, now)
        self._next_beat = now

    def order(self) -> list[int]:
        """The live brokers to try, best first: fewest outstanding items, ties in turn."""
        count = len(self.brokers)
        live = [i for i, broker in enumerate(self.brokers) if broker.live or not self.watch]
        live.sort(key=lambda i: (self.brokers[i].outstanding, (i - self._turn) % count))
        self._turn = (self._turn + 1) % count
        return live

    def heard(self, index: int) -> bool:
        """A message came from the broker; True if that brings it back from the dead."""
        broker = self.brokers[index]
        broker.last_heard = self.clock()
        if broker.live:
            return False
        broker.live = True
        return True

    def lost(self, index: int) -> bool:
        """Its connection dropped; True if it was live (it is dead now)."""
        return self._die(index, "when its connection dropped") if self.watch else False

    def silent(self) -> list[int]:
        """The live brokers that have been silent too long: each is dead from now on."""
        if not self.watch:
            return []
        now = self.clock()
        silent = [i for i, broker in enumerate(self.brokers) if broker.live and broker.last_heard < now - self.expiry_s]
        for index in silent:
            self._die(index, f"after {now - self.brokers[index].last_heard:.2f} s without an answer to heartbeats")
        return silent

    def heartbeat_due(self) -> bool:
        """Whether to heartbeat every broker now (the next is then one interval away)."""
        now = self.clock()
        if not self.watch or now < self._next_beat:
            return False
        self._next_beat = now + self.heartbeat_s
        return True

    def next_wakeup(self) -> float | None:
        """The clock time of the next heartbeat or expiry; None without liveness."""
        if not self.watch:
            return None
        expiries = [broker.last_heard + self.expiry_s for broker in self.brokers if broker.live]
        return min([self._next_beat, *expiries])

    def moved(self, request_id: bytes, source: int, target: int, items: int) -> None:
        """A request outstanding at ``source`` (dead, or without workers) now waits at ``target``."""
        self.brokers[source].outstanding -= items
        self.brokers[target].outstanding += items
        away = self.brokers[source].moved_away
        if not self.brokers[source].live and len(away) < MAX_MOVED_AWAY:
            away.add(request_id)  # to cancel there if it comes back (a live source has answered already)

    def take_moved_away(self, index: int) -> list[bytes]:
        """The ids to cancel at a broker that came back; forgotten once taken."""
        broker = self.brokers[index]
        ids, broker.moved_away = sorted(broker.moved_away), set()
        return ids

    def _die(self, index: int, why: str) -> bool:
        broker = self.brokers[index]
        if not broker.live:
            return False
        broker.live = False
        broker.deaths += 1
        broker.died_at, broker.why = self.clock(), why
        return True
