"""A worker is who its key says it is: the backend's check of every message against its connection's key.

The ZAP handler (:mod:`broker.curve`) answers each accepted handshake with the
key's file name as its User-Id, which libzmq then attaches to every message
of that connection.  :class:`WorkerKeyGuard` holds a worker to it: a message
whose routing id is not the User-Id of its connection (a READY whose
``name`` is not either) never reaches the routing core, and is logged.

That check cannot happen in the handshake itself: libzmq's ZAP request carries
the *server* socket's own routing id in its "identity" frame, not the
connecting peer's (zeromq/libzmq#4161), and the peer's routing id is only read
after the ZAP reply.  So the backend does not use ROUTER_HANDOVER with CURVE:
a connection whose routing id is held by another connection is left unrouted
by libzmq, and cannot take it over.  What remains is a connection that never
shows a message under its own key's name (unrouted, or holding a name that is
not its key's): the guard watches the backend's connections (a socket
monitor) and cuts any that has not done so within the liveness window, so a
name held that way is freed; ZMTP heartbeats free the name of a connection
whose host died.
"""

from __future__ import annotations

import logging
import os
import socket as stdlib_socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.backend import Socket as CythonSocket
from zmq.utils.monitor import parse_monitor_message

from broker.curve import RefusalLog
from zbatch.protocol import wire

log = logging.getLogger("zbatch.broker")
_recv = CythonSocket.recv
_READY_HEADER = wire.HEADERS[wire.Command.READY]


class WorkerKeyGuard:
    """The broker's backend under CURVE: a worker's routing id must be the name of its key.

    :meth:`receive` reads the backend in place of the plain reader: a message whose routing id is not
    its connection's User-Id (the key's name, from :class:`KeyAuthenticator`), or a READY naming
    another worker, is dropped and logged.  :meth:`on_monitor_event` reads the backend's socket
    monitor (:data:`MONITOR_EVENTS`): every accepted connection must show one good message within
    ``grace_s``, or :meth:`expire` cuts it (``shutdown`` of its descriptor: libzmq then closes it as
    if the peer had).  That frees a name held by a connection of another key that stays silent or
    is refused, and ends a connection libzmq left unrouted because its routing id was taken.
    """

    MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, refusals: RefusalLog, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.refusals = refusals
        self.cut = 0  # connections cut so far
        self._grace_s = grace_s
        self._clock = clock
        self._unproven: dict[int, tuple[float, _Connection]] = {}  # descriptor -> (deadline, connection)
        self._drain_monitor: Callable[[], None] = lambda: None

    def watch(self, drain_monitor: Callable[[], None]) -> None:
        """``drain_monitor`` reads every waiting monitor event now: called before cutting anything, so a
        descriptor closed and reused since is known as the new connection's."""
        self._drain_monitor = drain_monitor

    def receive(self, socket: CythonSocket) -> list[bytes] | None:
        """The next message, if its connection may use its routing id; None if it was refused."""
        first = _recv(socket, zmq.NOBLOCK, False)
        frames = [first.bytes]
        frame = first
        while frame.more:
            frame = _recv(socket, zmq.NOBLOCK, False)
            frames.append(frame.bytes)
        try:
            key = str(first.get("User-Id"))
        except zmq.ZMQError:  # no ZAP answer behind this connection: CURVE is off on it
            key = ""
        routing_id = frames[0]
        if routing_id != key.encode():
            self.refusals.warn(f"routing id {key}",
                               "CURVE: refused a message on the backend from a connection with key %r under "
                               "routing id %r: a worker's routing id must be its key's name (start it with "
                               "--name %s, or give it a key pair named as it)", key, _shown(routing_id), key)
            return None
        if len(frames) > 1 and frames[1] == _READY_HEADER and (name := _ready_name(frames[1:])) not in ("", key):
            self.refusals.warn(f"name {key}", "CURVE: refused READY from worker %r: it calls itself %r, but a "
                               "worker's name must be its key's name", key, name)
            return None
        if self._unproven:
            self._unproven.pop(int(first.get(zmq.SRCFD)), None)
        return frames

    def on_monitor_event(self, frames: list[bytes]) -> None:
        """One event of the backend's socket monitor: a connection accepted, or gone."""
        event = parse_monitor_message(frames)
        descriptor = int(event["value"])
        if event["event"] == zmq.EVENT_ACCEPTED:
            connection = _Connection.on(descriptor)
            if connection is not None:
                self._unproven[descriptor] = (self._clock() + self._grace_s, connection)
        else:
            self._unproven.pop(descriptor, None)

    def expire(self) -> float | None:
        """Cut the connections that showed no good message in time; the ``clock()`` of the next deadline."""
        now = self._clock()
        if any(deadline <= now for deadline, _ in self._unproven.values()):
            self._drain_monitor()
            for descriptor, (deadline, connection) in list(self._unproven.items()):
                if deadline <= now:
                    del self._unproven[descriptor]
                    self._cut(descriptor, connection)
        return min((deadline for deadline, _ in self._unproven.values()), default=None)

    def _cut(self, descriptor: int, connection: _Connection) -> None:
        if _Connection.on(descriptor) != connection:
            return  # closed since, and the number reused: not the connection we were watching
        self.cut += 1
        self.refusals.warn(f"cut {connection.host}",
                           "CURVE: cut the backend connection from %s: nothing came from it under its key's "
                           "name for %.1f s (its routing id is another key's name, or held by another "
                           "connection)", connection.peer, self._grace_s)
        try:
            with stdlib_socket.socket(fileno=os.dup(descriptor)) as duplicate:
                duplicate.shutdown(stdlib_socket.SHUT_RDWR)
        except OSError as exc:
            log.debug("could not cut descriptor %d: %s", descriptor, exc)


@dataclass(frozen=True)
class _Connection:
    """Which socket a descriptor holds (its inode: a reused number is another socket), and its peer."""

    inode: tuple[int, int]
    peer: str

    @property
    def host(self) -> str:
        return self.peer.rsplit(":", 1)[0]

    @classmethod
    def on(cls, descriptor: int) -> _Connection | None:
        """The socket on ``descriptor`` now, or None if there is none."""
        try:
            status = os.fstat(descriptor)
            with stdlib_socket.socket(fileno=os.dup(descriptor)) as duplicate:
                address = duplicate.getpeername()
        except OSError:
            return None
        peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else f"a local socket ({address or 'ipc'})"
        return cls((status.st_dev, status.st_ino), peer)


def _ready_name(frames: list[bytes]) -> str:
    """The ``name`` a READY announces; "" for a malformed one (the routing core refuses those)."""
    try:
        message = wire.decode_worker_message(frames)
    except wire.ProtocolError:
        return ""
    return message.name if isinstance(message, wire.Ready) else ""


def _shown(routing_id: bytes) -> str:
    text = routing_id.decode(errors="replace")
    return text if text.isprintable() else "0x" + routing_id.hex()
