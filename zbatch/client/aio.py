"""The asyncio client for the broker's frontend: the gateway uses it, and so can you.

One DEALER socket carries many requests at once (pipelining): each request
gets a fresh id, a future waits for the REPLY with that id, and one receive
task matches replies to futures.  Statuses other than ``ok`` become typed
exceptions (:class:`ZBatchError` subclasses) carrying the broker's message.

If the broker is not connected, a request fails at once with
:class:`BrokerUnavailable` instead of waiting (``IMMEDIATE`` plus a
non-blocking send); if a reply never comes, the wait ends at the request's
timeout plus a grace period for the broker's own deadline answer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import struct
import time
from typing import Any

import zmq
import zmq.asyncio

from zbatch.client.breaker import OverloadBreaker, Ticket
from zbatch.client.errors import BadRequest, BrokerUnavailable, WorkerError, raise_for_status
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Reply, Request, Status
from zbatch.runtime import sockets
from zbatch.runtime.curve import CurveKeys

DISCONNECT_GRACE_S = 0.1
SEND_RETRY_S = 0.005  # while the connection to the broker is being made


class AsyncClient:
    """Pipelined requests to one broker over one DEALER socket; use as ``async with``."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:5555",
        *,
        context: zmq.asyncio.Context | None = None,
        timeout_ms: int = 30_000,
        reply_grace_ms: int = 2_000,
        connect_timeout_ms: int = 500,
        overload_retries: int = 0,
        retry_backoff_ms: int = 50,
        fail_fast_overload: bool = True,
        curve: CurveKeys | None = None,
    ) -> None:
        """``curve``: the broker's public key and this client's key pair, for a broker with CURVE on.

        ``fail_fast_overload``: once the broker refuses a model as overloaded, refuse further
        requests for it (at that priority) here, at once, while one of them asks the broker
        again (see :mod:`zbatch.client.breaker`); they get the same ``overloaded`` answer, sooner.
        """
        self.endpoint = endpoint
        self.connect_timeout_ms = connect_timeout_ms
        self.overload_retries = overload_retries
        self.retry_backoff_ms = retry_backoff_ms
        self.timeout_ms = timeout_ms
        self.reply_grace_ms = reply_grace_ms
        self._breaker = OverloadBreaker() if fail_fast_overload else None
        self._context = context or zmq.asyncio.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        if curve is not None:  # a refused key never completes the handshake: requests fail fast
            curve.apply(self._socket)
        self._socket.connect(endpoint)
        # Sends and burst receives go through a synchronous view of the same socket (same
        # thread): the asyncio wrapper's future per message costs more than the message.
        self._sync = zmq.Socket.shadow(self._socket.underlying)
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._prefix = os.urandom(4)
        self._counter = itertools.count()
        self._poll_in = [(self._sync, zmq.POLLIN)]
        self._reading_on: asyncio.AbstractEventLoop | None = None
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def infer(
        self,
        model: str,
        inputs: list[Any],
        parameters: dict[str, Any] | None = None,
        *,
        timeout_ms: int | None = None,
        priority: int = wire.NORMAL_PRIORITY,
        trace: str = "",
    ) -> list[Any]:
        """Run ``inputs`` through ``model``; one output per input, arrays as numpy.

        ``priority`` is 0 (high), 1 (normal) or 2 (low); ``trace`` is an id that
        appears in the broker's and the worker's log lines for this request.
        An ``overloaded`` answer is retried ``overload_retries`` times, after the
        broker's ``retry_after_ms`` or an exponential backoff, whichever is longer.
        """
        try:
            payload = payloads.encode_payload({"inputs": inputs, "parameters": parameters or {}})
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadRequest(f"inputs or parameters cannot be sent: {exc}") from None
        for attempt in itertools.count():
            reply = await self.request(model, payload, items=len(inputs), timeout_ms=timeout_ms,
                                       priority=priority, trace=trace)
            if reply.status is not Status.OVERLOADED or attempt >= self.overload_retries:
                break
            backoff_ms = self.retry_backoff_ms * 2**attempt * random.uniform(0.5, 1.5)
            await asyncio.sleep(max(backoff_ms, reply.retry_after_ms or 0) / 1000)
        raise_for_status(reply)
        try:
            outputs = payloads.decode_payload(reply.payload)["outputs"]
        except (wire.ProtocolError, KeyError, TypeError) as exc:
            raise WorkerError(f"the worker sent an unreadable result ({exc})") from None
        return list(outputs)

    async def request(
        self,
        model: str,
        payload: bytes,
        *,
        items: int,
        timeout_ms: int | None = None,
        priority: int = wire.NORMAL_PRIORITY,
        trace: str = "",
    ) -> Reply:
        """Send one raw request and return its reply, whatever the status.

        Without ``timeout_ms`` the broker applies its default; ``self.timeout_ms``
        should match it, since it bounds how long this side waits.
        """
        key = (model, priority)
        ticket = Ticket.NORMAL if self._breaker is None else self._breaker.admit(key)
        if ticket is None:
            assert self._breaker is not None
            return Reply(b"", Status.OVERLOADED, f"model {model!r} is overloaded: the broker refused a request "
                         "for it moments ago and is being asked again; retry later",
                         retry_after_ms=self._breaker.retry_after_ms.get(key))
        request_id = self._new_id()
        frames = wire.encode_request(Request(request_id, model, items, payload, timeout_ms, priority, trace))
        wait_ms = (self.timeout_ms if timeout_ms is None else timeout_ms) + self.reply_grace_ms
        reply: Reply | None = None
        try:
            reply = await self._exchange(request_id, frames, wait_ms)
            return reply
        finally:
            if self._breaker is not None:
                overloaded = reply is not None and reply.status is Status.OVERLOADED
                self._breaker.settle(key, ticket, overloaded, reply.retry_after_ms if reply else None)

    async def stats(self, *, timeout_ms: int = 2_000) -> dict[str, Any]:
        """The broker's statistics: models, backlogs, workers, batches."""
        request_id = self._new_id()
        reply = await self._exchange(request_id, wire.encode_stats_query(request_id), timeout_ms)
        raise_for_status(reply)
        stats: dict[str, Any] = payloads.decode_payload(reply.payload)
        return stats

    async def close(self) -> None:
        self._stop_reading()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)

    def _new_id(self) -> bytes:
        return self._prefix + struct.pack(">Q", next(self._counter))

    async def _exchange(self, request_id: bytes, frames: list[bytes], wait_ms: int) -> Reply:
        self._ensure_receiver()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[request_id] = future
        timer: asyncio.TimerHandle | None = None
        try:
            await self._send_or_fail(frames)
            # A timer on the future itself: asyncio.wait_for wraps it in more futures and callbacks,
            # which cost more than the rest of the exchange.
            timer = loop.call_later(wait_ms / 1000, self._give_up, future, wait_ms)
            try:
                return await future
            except asyncio.CancelledError:
                self._send_cancel(request_id)
                raise
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # a connection lost before the send failed: already reported by the raise

    def _give_up(self, future: asyncio.Future[Reply], wait_ms: int) -> None:
        if not future.done():
            future.set_exception(BrokerUnavailable(f"no answer from the broker at {self.endpoint} within {wait_ms} ms"))

    async def _send_or_fail(self, frames: list[bytes]) -> None:
        """Send now, or within ``connect_timeout_ms`` if the connection is still being made; else fail fast.

        The wait tries again every few milliseconds instead of awaiting the socket:
        zmq.asyncio's poll would take over the descriptor's reader, which delivers the replies.
        """
        if self._try_send(frames):
            return
        give_up_at = time.monotonic() + self.connect_timeout_ms / 1000
        while time.monotonic() < give_up_at:
            await asyncio.sleep(SEND_RETRY_S)
            if self._try_send(frames):
                return
        raise BrokerUnavailable(
            f"the broker at {self.endpoint} is not connected; start zbatch-broker or check the address"
        )

    def _try_send(self, frames: list[bytes]) -> bool:
        """A non-blocking send through the synchronous view: no future per message."""
        try:
            sockets.send_frames(self._sync, frames)
        except zmq.Again:
            return False
        # The socket's descriptor is edge-triggered, and this send may have consumed the
        # edge that announced a reply: the reader would not wake for it, so look now.
        self._deliver_queued_replies()
        return True

    def _send_cancel(self, request_id: bytes) -> None:
        """Tell the broker the caller gave up, so the work is skipped if it has not started.

        If it cannot be sent now, the broker's deadline cleans up instead.
        """
        self._try_send(wire.encode_cancel(request_id))

    def _ensure_receiver(self) -> None:
        """Replies are taken by a reader on the socket's descriptor: no task or future per wakeup."""
        loop = asyncio.get_running_loop()
        if self._reading_on is not loop:
            self._stop_reading()
            loop.add_reader(self._sync.FD, self._deliver_queued_replies)
            self._reading_on = loop
        if self._watcher is None or self._watcher.done():
            self._watcher = loop.create_task(self._watch_connection())

    def _stop_reading(self) -> None:
        if self._reading_on is not None and not self._reading_on.is_closed():
            self._reading_on.remove_reader(self._sync.FD)
        self._reading_on = None

    async def _watch_connection(self) -> None:
        """When the connection drops, fail what is pending now: the broker lost it anyway."""
        while True:
            await self._monitor.recv_multipart()  # only EVENT_DISCONNECTED is subscribed
            # The broker's last answers can reach this socket just after the event: take them first.
            await asyncio.sleep(DISCONNECT_GRACE_S)
            self._deliver_queued_replies()
            lost = BrokerUnavailable(
                f"lost the connection to the broker at {self.endpoint}; the request may not have run"
            )
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(lost)

    def _deliver_queued_replies(self) -> None:
        """Take every reply already received, without waiting (same thread, same socket).

        zmq_poll asks whether one is there (1 us) where a failed recv raises (4 us);
        it also re-arms the edge-triggered descriptor, so the next reply wakes the reader.
        """
        while zmq.zmq_poll(self._poll_in, 0):
            self._deliver(sockets.recv_frames(self._sync))

    def _deliver(self, frames: list[bytes]) -> None:
        try:
            reply = wire.decode_reply(frames)
        except wire.ProtocolError:
            return  # not ours to answer; the matching request will time out
        future = self._pending.get(reply.request_id)
        if future is not None and not future.done():
            future.set_result(reply)
