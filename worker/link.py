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
after READY means the worker is registered (``on_registered``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from zbatch.protocol import wire
from zbatch.protocol.wire import BrokerToWorkerMessage, Disconnect, ProtocolError
from zbatch.runtime import sockets
from zbatch.runtime.curve import CurveKeys

log = logging.getLogger("zbatch.worker")
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 32.0


class BrokerLink:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        endpoint: str,
        identity: bytes,
        heartbeat_s: float,
        liveness: int,
        *,
        ready: Callable[[], list[bytes]],
        heartbeat: Callable[[], list[bytes]],
        deliver: Callable[[BrokerToWorkerMessage], None],
        on_registered: Callable[[], None],
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
        self._awaiting_registration = False
        self._socket: zmq.asyncio.Socket | None = None
        self._sender: zmq.Socket | None = None
        self._backoff_s = INITIAL_BACKOFF_S
        self._last_heard = time.monotonic()
        self._look_scheduled = False
        self.connections = 0
        self.announce = True  # cleared while draining: a draining worker must not register again

    async def run(self) -> None:
        """Stay connected until cancelled."""
        while True:
            self._open()
            await self._serve_until_silent()
            log.warning("broker silent for %.1f s; reconnecting in %.0f s",
                        self._heartbeat_s * self._liveness, self._backoff_s)
            self.close(linger_ms=0)
            await asyncio.sleep(self._backoff_s)
            self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)

    def send(self, frames: list[bytes]) -> None:
        if self._sender is None:
            return  # between connections: the broker has given these jobs up already
        try:
            sockets.send_frames(self._sender, frames)
        except zmq.Again:
            log.warning("dropped a message to the broker: send queue full")
        # The socket's file descriptor is edge-triggered, and this send may have consumed the
        # edge that announced a request: the waiting poll would not wake, so look soon.
        if not self._look_scheduled and self._sender.get(zmq.EVENTS) & zmq.POLLIN:
            self._look_scheduled = True
            asyncio.get_running_loop().call_soon(self._look)

    def _look(self) -> None:
        self._look_scheduled = False
        if self._sender is not None:
            self._receive_all()

    def close(self, linger_ms: int) -> None:
        if self._socket is not None:
            self._socket.close(linger=linger_ms)
        self._socket = self._sender = None

    def _open(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self._identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        if self._curve is not None:  # a refused key never connects: the broker stays silent, we retry
            self._curve.apply(sock)
        sock.connect(self.endpoint)
        self._socket = sock
        self._sender = zmq.Socket.shadow(sock.underlying)
        self.connections += 1
        if self.announce:
            self._announce()

    def _announce(self) -> None:
        self.send(self._ready())
        self._awaiting_registration = True

    async def _serve_until_silent(self) -> None:
        assert self._socket is not None and self._sender is not None
        self._last_heard = next_beat = time.monotonic()
        while time.monotonic() - self._last_heard <= self._heartbeat_s * self._liveness:
            wait_ms = max(0, int((next_beat - time.monotonic()) * 1000))
            if await self._socket.poll(wait_ms, zmq.POLLIN):
                self._receive_all()
            if time.monotonic() >= next_beat:
                self.send(self._heartbeat())
                next_beat = time.monotonic() + self._heartbeat_s

    def _receive_all(self) -> None:
        assert self._sender is not None
        while True:
            try:
                frames = sockets.recv_frames(self._sender)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            self._backoff_s = INITIAL_BACKOFF_S
            try:
                message = wire.decode_broker_to_worker(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            if isinstance(message, Disconnect):
                if self.announce:
                    log.warning("the broker does not know this worker (%s); registering again", message.reason)
                    self._announce()
            else:
                if self._awaiting_registration:
                    self._awaiting_registration = False
                    self._on_registered()
                self._deliver(message)
