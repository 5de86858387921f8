"""The worker's connection to the broker: READY, heartbeats, liveness and reconnection.

Paranoid Pirate, done in the I/O loop: the worker sends a HEARTBEAT every
interval (never from the inference thread, so a stuck model shows up as
silence only if the loop itself is stuck), counts any message from the broker
as a sign of life, and when the broker has been silent for ``liveness``
intervals it drops the socket and connects a new one after an exponential
backoff (1 s doubling to 32 s), announcing READY again.  A broker that does
not know the worker (it restarted) says DISCONNECT, and the worker answers
with READY at once.

The protocol has no acknowledgement of READY, but the broker only ever
sends DISCONNECT to a worker it does not know: the first other message
after READY means the worker is registered (``on_registered``).  Silence,
or a DISCONNECT, means it is not any more (``on_lost``): the broker has
given up the work it sent (a worker of several brokers moves that broker's
share of its capacity to the others, :mod:`worker.shares`).

Each connection is one DEALER socket read by a
:class:`~zbatch.runtime.sockets.PolledSockets`, which hands every message to
the worker as it arrives; a reconnection replaces both.  If handling a
message raises, the link's task ends with that error: the link is
essential, and the daemon's lifecycle exits rather than serve without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq

from zbatch.protocol import wire
from zbatch.protocol.wire import BrokerToWorkerMessage, Disconnect, ProtocolError
from zbatch.runtime.curve import CurveKeys
from zbatch.runtime.sockets import PolledSockets, Socket, open_socket

log = logging.getLogger("zbatch.worker")
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 32.0
SEND_HWM = 100_000


class BrokerLink:
    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        identity: bytes,
        heartbeat_s: float,
        liveness: int,
        *,
        ready: Callable[[], list[bytes]],
        heartbeat: Callable[[], list[bytes]],
        deliver: Callable[[BrokerToWorkerMessage], None],
        on_registered: Callable[[], None],
        on_lost: Callable[[], None] = lambda: None,
        curve: CurveKeys | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._curve = curve
        self._context = context
        self._identity = identity
        self._heartbeat_s = heartbeat_s
        self._liveness = liveness
        self._ready = ready
        self._heartbeat = heartbeat
        self._deliver = deliver
        self._on_registered = on_registered
        self._on_lost = on_lost
        self._awaiting_registration = False
        self.registered = False
        self._socket: Socket | None = None
        self._poller: PolledSockets | None = None
        self._backoff_s = INITIAL_BACKOFF_S
        self._last_heard = time.monotonic()
        self.connections = 0
        self.announce = True  # cleared while draining: a draining worker must not register again

    async def run(self) -> None:
        """Stay connected until cancelled; raise what broke the handling of a message."""
        while True:
            self._open()
            await self._serve_until_silent()
            log.warning("broker %s silent for %.1f s; reconnecting in %.0f s", self.endpoint,
                        self._heartbeat_s * self._liveness, self._backoff_s)
            self.close(linger_ms=0)
            self._lost()
            await asyncio.sleep(self._backoff_s)
            self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)

    def send(self, frames: list[bytes]) -> None:
        if self._socket is None or self._poller is None:
            return  # between connections: the broker has given these jobs up already
        try:
            self._poller.send(self._socket, frames)
        except zmq.Again:
            log.warning("dropped a message to the broker: send queue full")

    def close(self, linger_ms: int) -> None:
        if self._poller is not None:
            self._poller.close()
        if self._socket is not None:
            self._socket.close(linger=linger_ms)
        self._socket = self._poller = None

    def _open(self) -> None:
        # With CURVE, a refused key never connects: the broker stays silent, and the link retries.
        self._socket = open_socket(self._context, zmq.DEALER, connect=self.endpoint, routing_id=self._identity,
                                   send_hwm=SEND_HWM, curve=self._curve)
        self._poller = PolledSockets({self._socket: self._receive})
        self.connections += 1
        if self.announce:
            self._announce()

    def _announce(self) -> None:
        self.send(self._ready())
        self._awaiting_registration = True

    async def _serve_until_silent(self) -> None:
        """Heartbeat every interval until the broker has been silent too long; messages come in meanwhile."""
        assert self._poller is not None
        reading = self._poller.stopped
        self._last_heard = next_beat = time.monotonic()
        while time.monotonic() - self._last_heard <= self._heartbeat_s * self._liveness:
            await asyncio.wait((reading,), timeout=max(0.0, next_beat - time.monotonic()))
            if reading.done():
                reading.result()  # a message handler raised: end the link with its error
                raise RuntimeError("the broker link stopped reading")
            if time.monotonic() >= next_beat:
                self.send(self._heartbeat())
                next_beat = time.monotonic() + self._heartbeat_s

    def _receive(self, frames: list[bytes]) -> None:
        self._last_heard = time.monotonic()
        self._backoff_s = INITIAL_BACKOFF_S
        try:
            message = wire.decode_broker_to_worker(frames)
        except ProtocolError as exc:
            log.warning("dropped a malformed message from the broker: %s", exc)
            return
        if isinstance(message, Disconnect):
            self._lost()
            if self.announce:
                log.warning("the broker %s does not know this worker (%s); registering again", self.endpoint,
                            message.reason)
                self._announce()
        else:
            if self._awaiting_registration:
                self._awaiting_registration = False
                self.registered = True
                self._on_registered()
            self._deliver(message)

    def _lost(self) -> None:
        """The broker no longer counts this worker as registered, nor the work it sent."""
        if self.registered:
            self.registered = False
            self._on_lost()
