"""ZeroMQ sockets for the daemons and the client: one factory, the fast multipart path, and the polled reader.

* :func:`open_socket` makes a synchronous socket with the options zbatch uses, then binds or connects it.
* :func:`send_frames` and :func:`recv_frames` send and receive a multipart message without pyzmq's
  per-frame wrappers.
* :class:`PolledSockets` reads sockets on an asyncio loop with plain callbacks: no task, future or timer
  per message.

Theory of operation
-------------------
pyzmq's ``Socket.send_multipart`` type-checks every part, then sends each one
through the Python-level ``Socket.send`` wrapper (which handles routing ids
and groups this protocol never uses); ``recv_multipart`` reads RCVMORE through
the generic option getter.  For this protocol's small frames the wrappers cost
more than libzmq itself, so :func:`send_frames` and :func:`recv_frames` call
the Cython base class's methods, which every pyzmq socket inherits.  Frames
must be bytes; errors are the usual ``zmq.ZMQError`` (``zmq.Again`` when
nothing can be done now).  libzmq accepts or refuses a multipart message as a
whole at its first frame, so a send never leaves half a message behind.

The sockets are synchronous and every call on them is non-blocking: waiting
is :class:`PolledSockets`' job, through ``loop.add_reader`` on each socket's
file descriptor.  That descriptor is edge-triggered: it turns readable when
the socket's state changes, and any call that lets libzmq process its
commands (``zmq_poll``, a receive, and a send too, even one that fails)
consumes the edge.  Hence the rules the reader follows:

* each wake drains: it asks ``zmq_poll(..., 0)`` which sockets hold a message
  (one C call for all of them, cheaper than a receive that raises
  ``zmq.Again``), takes one message from each, and asks again; a ``zmq_poll``
  that finds nothing re-arms the edge, so the next message wakes the reader;
* a wake runs at most :data:`MAX_ROUNDS_PER_WAKE` rounds, then schedules the
  next one behind whatever else the loop has to do (``call_soon``): a flood
  cannot starve timers, signals or other sockets;
* after a send, input is looked at again: the send may have consumed the
  edge that announced a message, and nothing else would wake the reader.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import zmq
from zmq.backend import Socket as CythonSocket

from zbatch.runtime.curve import CurveKeys


class CurveAuthority(Protocol):
    """What serves CURVE on a bound socket: the broker's key pair and its allow-list per ZAP domain."""

    def secure(self, socket: zmq.Socket[Any], domain: str) -> None: ...


Socket = zmq.Socket[bytes]
Handler = Callable[[list[bytes]], None]
Receiver = Callable[[CythonSocket], "list[bytes] | None"]  # a message, or None when it was refused

MAX_ROUNDS_PER_WAKE = 256

_send = CythonSocket.send
_recv = CythonSocket.recv
_MORE = zmq.SNDMORE | zmq.NOBLOCK
_LAST = zmq.NOBLOCK


def open_socket(
    context: zmq.Context[Any],
    kind: int,
    *,
    bind: str = "",
    connect: str = "",
    linger_ms: int = 0,
    send_hwm: int | None = None,
    receive_hwm: int | None = None,
    routing_id: bytes | None = None,
    immediate: bool = False,
    mandatory: bool = False,
    handover: bool = False,
    max_message_bytes: int | None = None,
    curve: CurveKeys | tuple[CurveAuthority, str] | None = None,
    heartbeat_ms: int | None = None,
    heartbeat_timeout_ms: int | None = None,
    monitor: tuple[str, int] | None = None,
) -> Socket:
    """A synchronous socket of ``kind`` with these options, bound to ``bind`` or connected to ``connect``.

    ``immediate``: queue messages only for a completed connection, so a send fails at once
    when the peer is absent.  ``mandatory`` and ``handover`` are ROUTER_MANDATORY (a send to
    a vanished peer raises instead of dropping silently) and ROUTER_HANDOVER (a peer that
    reconnects with the same routing id takes over its old connection).  ``max_message_bytes``
    is MAXMSGSIZE: libzmq drops the connection of a peer that sends a larger frame.
    ``curve``: a peer's keys, or the broker's :class:`CurveAuthority` and the ZAP domain whose
    keys may connect.  ``heartbeat_ms`` and ``heartbeat_timeout_ms`` are ZMTP's own PING and the
    silence after which libzmq closes a connection (a peer whose host died).  ``monitor``: the
    inproc endpoint and events of a socket monitor, started before the bind so it sees every connection.
    A failed bind or connect raises OSError naming the endpoint.
    """
    if bool(bind) == bool(connect):
        raise ValueError("give exactly one of bind and connect")
    socket: Socket = context.socket(kind, socket_class=zmq.Socket)
    try:
        _configure(socket, linger_ms, send_hwm, receive_hwm, routing_id, immediate, mandatory, handover,
                   max_message_bytes, curve)
        for option, value in ((zmq.HEARTBEAT_IVL, heartbeat_ms), (zmq.HEARTBEAT_TIMEOUT, heartbeat_timeout_ms)):
            if value is not None:
                socket.setsockopt(option, value)
        if monitor is not None:
            socket.monitor(*monitor)
        if bind:
            socket.bind(bind)
        else:
            socket.connect(connect)
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        reason = zmq.strerror(exc.errno) if exc.errno else str(exc)  # pyzmq's own text repeats the endpoint
        raise OSError(f"cannot {'bind' if bind else 'connect'} {bind or connect}: {reason}") from None
    return socket


def _configure(socket: Socket, linger_ms: int, send_hwm: int | None, receive_hwm: int | None,
               routing_id: bytes | None, immediate: bool, mandatory: bool, handover: bool,
               max_message_bytes: int | None, curve: CurveKeys | tuple[CurveAuthority, str] | None) -> None:
    socket.setsockopt(zmq.LINGER, linger_ms)
    options = {zmq.SNDHWM: send_hwm, zmq.RCVHWM: receive_hwm, zmq.ROUTING_ID: routing_id,
               zmq.IMMEDIATE: 1 if immediate else None, zmq.ROUTER_MANDATORY: 1 if mandatory else None,
               zmq.ROUTER_HANDOVER: 1 if handover else None, zmq.MAXMSGSIZE: max_message_bytes}
    for option, value in options.items():
        if value is not None:
            socket.setsockopt(option, value)
    if isinstance(curve, CurveKeys):
        curve.apply(socket)
    elif curve is not None:
        server, domain = curve
        server.secure(socket, domain)


def send_frames(socket: CythonSocket, frames: Sequence[bytes]) -> None:
    """Send ``frames`` as one message now, or raise ``zmq.Again``."""
    last = len(frames) - 1
    for index in range(last):
        _send(socket, frames[index], _MORE)
    _send(socket, frames[last], _LAST)


def recv_frames(socket: CythonSocket) -> list[bytes]:
    """The next whole message, or ``zmq.Again`` if none is queued.

    Frames are received as ``zmq.Frame`` only to read their ``more`` flag,
    which is a plain attribute, while the RCVMORE option goes through an enum
    lookup per call.
    """
    frame = _recv(socket, _LAST, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(socket, _LAST, False)
        frames.append(frame.bytes)
    return frames


class PolledSockets:
    """Reads ``handlers``' sockets on the running loop and hands each message to its socket's handler.

    Create it on the loop that reads; :meth:`close` stops reading (the sockets
    stay open: their owner closes them, after this).  ``after_round`` runs after
    each round of receives (the broker sends what its core decided);
    ``after_wake`` runs after each wake and may return the ``time.monotonic()``
    at which to wake again without input (the broker's timers).  Send through
    :meth:`send`, so input is looked at again afterwards.

    ``stopped`` is done once reading has stopped: with None after :meth:`close`,
    with the exception if a handler or hook raised (reading stops then too).

    ``receivers`` replaces :func:`recv_frames` for some sockets: a receiver reads one message
    and returns it, or None for one it refused (the broker's CURVE backend checks each
    message's key, :class:`~zbatch.runtime.curve.WorkerKeyGuard`).
    """

    def __init__(self, handlers: Mapping[Socket, Handler], *, after_round: Callable[[], None] | None = None,
                 after_wake: Callable[[], float | None] | None = None,
                 receivers: Mapping[Socket, Receiver] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped: asyncio.Future[None] = self.loop.create_future()
        self._handlers: dict[CythonSocket, Handler] = dict(handlers.items())
        self._receivers: dict[CythonSocket, Receiver] = {
            socket: (receivers or {}).get(socket, recv_frames) for socket in handlers}
        self._inputs = [(socket, zmq.POLLIN) for socket in self._handlers]
        self._descriptors = [socket.FD for socket in self._handlers]
        self._after_round = after_round
        self._after_wake = after_wake
        self._waking = False  # inside wake(): sends leave the re-check to the wake's end
        self._sent = False  # a send since the last zmq_poll of this wake
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        for descriptor in self._descriptors:
            self.loop.add_reader(descriptor, self.wake)
        self._schedule()  # what arrived before the readers were installed, and the first arming of each edge

    def send(self, socket: Socket, frames: Sequence[bytes]) -> None:
        """Send ``frames`` on ``socket`` now, or raise ``zmq.ZMQError`` (``zmq.Again``: the queue is full)."""
        self._sent = True
        try:
            send_frames(socket, frames)
        finally:
            # Outside a wake, look now: the send may have consumed the edge that announced input.
            if not self._waking and not self.stopped.done() and zmq.zmq_poll(self._inputs, 0):
                self._schedule()

    def wake(self) -> None:
        """Take what is waiting, up to the round limit; the readers, the timer and :meth:`send` call this."""
        self._scheduled = False
        if self.stopped.done():
            return
        self._waking = True
        try:
            drained = self._rounds()
            wake_at = self._after_wake() if self._after_wake is not None else None
            if drained and self._sent and zmq.zmq_poll(self._inputs, 0):
                drained = False  # a send in after_wake consumed the edge of new input
        except Exception as exc:
            self._fail(exc)
            return
        finally:
            self._waking = False
        if not drained:
            self._schedule()
        if wake_at is not None:
            self._arm_timer(wake_at)

    def close(self) -> None:
        """Stop reading; ``stopped`` gets None unless a failure came first."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.loop.is_closed():  # nothing is read, and nothing could hear of it, any more
            return
        for descriptor in self._descriptors:
            self.loop.remove_reader(descriptor)
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _rounds(self) -> bool:
        """Up to MAX_ROUNDS_PER_WAKE rounds of one message per ready socket; False if input is still waiting."""
        inputs, handlers, receivers, after_round = self._inputs, self._handlers, self._receivers, self._after_round
        for _ in range(MAX_ROUNDS_PER_WAKE):
            self._sent = False
            ready = zmq.zmq_poll(inputs, 0)
            if not ready:
                return True
            for socket, _ in ready:
                try:
                    frames = receivers[socket](socket)
                except zmq.Again:  # announced but gone (a peer dropped for an oversized frame)
                    continue
                if frames is not None:
                    handlers[socket](frames)
            if after_round is not None:
                after_round()
        return False

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.wake)

    def _arm_timer(self, when: float) -> None:
        """One timer, at the earliest wake asked for; an earlier one already set stands."""
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_later(max(0.0, when - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.wake()

    def _fail(self, exc: Exception) -> None:
        if not self.stopped.done():
            self.stopped.set_exception(exc)
        self.close()
