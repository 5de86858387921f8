"""What the client does when a broker goes away: the requests outstanding there moved, resent or failed.

:class:`BrokerLoss` is :class:`~zbatch.client.aio.AsyncClient`'s half that reacts to its brokers' connections
and heartbeats (the module docstring of :mod:`zbatch.client.aio` states the rules):

* with several brokers, a broker silent past the liveness window, or whose connection dropped, is dead: what
  was outstanding there is sent again to a live one with the time it has left (``replay``) or fails with
  :class:`BrokerUnavailable`, and its overload verdicts are forgotten; when it answers again, what was moved
  away from it is cancelled there;
* with one broker, a dropped connection strands what was outstanding; it is sent again once the connection is
  back, or fails after ``restart_wait_s``;
* an answer of ``ELSEWHERE`` (no worker there) sends the request on to a broker it has not been to.

Each request waiting for its answer is a :class:`Pending`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import parse_monitor_message

from zbatch.client.breaker import OverloadBreaker
from zbatch.client.brokers import BrokerSet
from zbatch.client.errors import BrokerUnavailable
from zbatch.protocol import wire
from zbatch.protocol.wire import Reply, Request
from zbatch.runtime.sockets import PolledSockets, Socket

HEARTBEAT = wire.encode_heartbeat()
DISCONNECT_GRACE_S = 0.1  # after a drop, for the broker's last answers to be read first


@dataclass(eq=False)
class Pending:
    """A request waiting for its answer: where it is now, and what it takes to send it elsewhere."""

    request_id: bytes
    future: asyncio.Future[Reply]
    broker: int
    request: Request | None = None  # None: a STATS, which belongs to its broker
    deadline: float = 0.0  # time.monotonic() of the request's own deadline, for a replay's timeout
    timeout_ms: int = 0  # its deadline as the broker counts it, for the breaker
    sent_at: float = 0.0  # time.monotonic() of its last send, for the breaker
    answered_by: int = -1  # the broker whose answer settled it
    moved_from: set[int] = field(default_factory=set)

    @property
    def items(self) -> int:
        return 0 if self.request is None else self.request.items


class BrokerLoss:
    """The client's state this half reads and changes, and the one send it needs; AsyncClient provides them."""

    endpoints: list[str]
    brokers: BrokerSet
    replay: bool
    restart_wait_s: float  # one broker: how long after a drop its requests wait for it to come back
    _pending: dict[bytes, Pending]
    _stranded: dict[bytes, float]  # one broker: requests outstanding when its connection dropped
    _dropped_at: float | None  # one broker: when its connection dropped, until it is back
    _poller: PolledSockets | None
    _breaker: OverloadBreaker | None
    _sockets: list[Socket]

    def _try_send(self, index: int, frames: list[bytes]) -> bool:
        raise NotImplementedError

    def _on_event(self, index: int, frames: list[bytes]) -> None:
        """A connection event: a drop fails (or moves) what is pending there, once the grace has passed.

        The broker's last answers can reach this socket just after the event, so they are taken first.
        """
        if parse_monitor_message(frames)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self.brokers.watch:
                self._try_send(index, HEARTBEAT)  # a broker back: its answer makes it live again
            else:
                self._dropped_at = None
                self._resend_stranded(index)
            return
        if not self.brokers.watch:
            self._dropped_at = time.monotonic()  # new requests wait for it from now on
        asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._connection_lost, index)

    def _connection_lost(self, index: int) -> None:
        if self._poller is not None:
            self._poller.wake()
        if self.brokers.watch:
            if self.brokers.lost(index):
                self._broker_died(index)
            return
        lost = BrokerUnavailable(
            f"lost the connection to the broker at {self.endpoints[index]}; the request may not have run"
        )
        now = time.monotonic()
        for request_id, pending in self._pending.items():
            if pending.future.done():
                continue
            if pending.request is not None and self.replay:
                self._stranded.setdefault(request_id, now)
            else:
                pending.future.set_exception(lost)
        self._resend_stranded(index)  # the connection may be back already
        asyncio.get_running_loop().call_later(self.restart_wait_s, self._abandon_stranded, lost)

    def _abandon_stranded(self, lost: BrokerUnavailable) -> None:
        """Fail what has waited ``restart_wait_s`` for its broker to come back."""
        too_old = time.monotonic() - self.restart_wait_s
        for request_id, stranded_at in list(self._stranded.items()):
            pending = self._pending.get(request_id)
            if stranded_at <= too_old and pending is not None and not pending.future.done():
                pending.future.set_exception(lost)

    def _resend_stranded(self, index: int) -> None:
        """One broker, back (or maybe back): send it again what its dropped connection stranded, each with
        the time it has left; what cannot go now waits for the next handshake, or its own deadline."""
        for request_id in list(self._stranded):
            pending = self._pending.get(request_id)
            if pending is None or pending.future.done() or pending.request is None:
                del self._stranded[request_id]
            elif self._try_send(index, self._frames_with_time_left(pending)):
                del self._stranded[request_id]
                pending.sent_at = time.monotonic()

    def _watch(self) -> float | None:
        """After each wake: give up silent brokers, heartbeat every broker when due; the next wake."""
        for index in self.brokers.silent():
            self._broker_died(index)
        if self.brokers.heartbeat_due():
            for index in range(len(self._sockets)):
                self._try_send(index, HEARTBEAT)
        return self.brokers.next_wakeup()

    def _broker_died(self, index: int) -> None:
        """Move what is outstanding at a dead broker to live ones, or fail it; its verdicts die with it."""
        self._forget_verdicts(index)
        why = self._dead_text(index)
        for request_id, pending in list(self._pending.items()):
            if pending.broker != index or pending.future.done():
                continue
            if pending.request is None or not self.replay or not self._replay(request_id, pending):
                pending.future.set_exception(BrokerUnavailable(
                    f"{why}; the request may not have run"
                    + ("" if pending.request is None or not self.replay else ", and no other broker is live")))

    def _dead_text(self, index: int) -> str:
        return (f"the broker at {self.endpoints[index]} is not answering heartbeats: it "
                f"{self.brokers[index].obituary(self.brokers.clock())}")

    def _replay(self, request_id: bytes, pending: Pending, avoid: set[int] | None = None) -> bool:
        """Send a request again to the best live broker (not one of ``avoid``), with the time left;
        False if none takes it."""
        old = pending.broker
        avoid = avoid or {old}
        frames = self._frames_with_time_left(pending)
        for index in self.brokers.order():
            if index not in avoid and self._try_send(index, frames):
                pending.broker, pending.sent_at = index, time.monotonic()
                pending.moved_from.add(old)
                self.brokers.moved(request_id, old, index, pending.items)
                return True
        return False

    @staticmethod
    def _frames_with_time_left(pending: Pending) -> list[bytes]:
        """The request again, its timeout what is left of its own deadline."""
        request = pending.request
        assert request is not None
        remaining_ms = max(1, round((pending.deadline - time.monotonic()) * 1000))
        return wire.encode_request(Request(pending.request_id, request.model, request.items, request.payload,
                                           remaining_ms, request.priority, request.trace, grouped=True))

    def _elsewhere(self, request_id: bytes, pending: Pending) -> bool:
        """Send a request a broker had no worker for (``ELSEWHERE``) to a live broker it has not been to;
        False if none."""
        if not self.brokers.watch or pending.request is None:
            return False
        tried = {pending.broker, *pending.moved_from}
        if all(index in tried for index in self.brokers.order()):
            return False
        return self._replay(request_id, pending, avoid=tried)

    def _rejoined(self, index: int) -> None:
        """A dead broker answers again: cancel there what was moved away from it while it was gone.  It may
        be a new process, with a state of its own: what an old one refused says nothing of it."""
        self._forget_verdicts(index)
        for request_id in self.brokers.take_moved_away(index):
            self._try_send(index, wire.encode_cancel(request_id))

    def _forget_verdicts(self, index: int) -> None:
        if self._breaker is not None:
            self._breaker.forget(lambda key: isinstance(key, tuple) and key[0] == index)
