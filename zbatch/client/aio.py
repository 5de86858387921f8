"""The asyncio client for the broker's frontend: the gateway uses it, and so can you.

One DEALER socket carries many requests at once (pipelining): each request
gets a fresh id, a future waits for the REPLY with that id, and the socket's
reader (:class:`~zbatch.runtime.sockets.PolledSockets`) matches replies to
futures as they arrive.  Statuses other than ``ok`` become typed
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
from zbatch.client.errors import BadRequest, BrokerUnavailable, WorkerError, ZBatchError, raise_for_status
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Reply, Request, Status
from zbatch.runtime.curve import CurveKeys
from zbatch.runtime.sockets import PolledSockets, open_socket

HEARTBEAT = wire.encode_heartbeat()
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
        # With CURVE, a refused key never completes the handshake: requests fail fast.
        self._socket = open_socket(self._context, zmq.DEALER, connect=endpoint, immediate=True, curve=curve)
        # Connection events (only EVENT_DISCONNECTED) arrive on a PAIR socket read with the replies.
        monitor = f"inproc://zbatch-client-monitor.{self._socket.FD}"
        self._socket.monitor(monitor, zmq.EVENT_DISCONNECTED)
        self._monitor = open_socket(self._context, zmq.PAIR, connect=monitor)
        self._pending: dict[bytes, asyncio.Future[Reply]] = {}
        self._prefix = os.urandom(4)
        self._counter = itertools.count()
        self._poller: PolledSockets | None = None

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
        if self._poller is not None:
            self._poller.close()
            self._poller = None
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)

    def _new_id(self) -> bytes:
        return self._prefix + struct.pack(">Q", next(self._counter))

    async def _exchange(self, request_id: bytes, frames: list[bytes], wait_ms: int) -> Reply:
        self._ensure_reader()
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

        The wait tries again every few milliseconds: the reader watches for input, not for
        the moment the connection completes, and waiting here is rare.
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
        """A non-blocking send: no future per message; False when it cannot go now (or the client is closed)."""
        if self._poller is None:
            return False
        try:
            self._poller.send(self._socket, frames)
        except zmq.Again:
            return False
        return True

    def _send_cancel(self, request_id: bytes) -> None:
        """Tell the broker the caller gave up, so the work is skipped if it has not started.

        If it cannot be sent now, the broker's deadline cleans up instead.
        """
        self._try_send(wire.encode_cancel(request_id))

    def _ensure_reader(self) -> None:
        """Replies and connection events are read on the loop that asks; a new loop gets a new reader."""
        loop = asyncio.get_running_loop()
        if self._poller is not None and self._poller.loop is loop and not self._poller.stopped.done():
            return
        if self._poller is not None:
            self._poller.close()
        self._poller = PolledSockets({self._socket: self._deliver, self._monitor: self._on_disconnect})
        self._poller.stopped.add_done_callback(self._reading_stopped)

    def _reading_stopped(self, stopped: asyncio.Future[None]) -> None:
        """A reply handler failed: fail what is pending with its error; the next request reads again."""
        if stopped.cancelled() or stopped.exception() is None:
            return
        error = stopped.exception()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrokerUnavailable(f"reading replies from {self.endpoint} failed: {error!r}"))

    def _on_disconnect(self, event: list[bytes]) -> None:
        """The connection dropped (a monitor event): fail what is pending, once the grace has passed.

        The broker's last answers can reach this socket just after the event, so they are taken first.
        """
        asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._connection_lost)

    def _connection_lost(self) -> None:
        if self._poller is not None:
            self._poller.wake()
        lost = BrokerUnavailable(
            f"lost the connection to the broker at {self.endpoint}; the request may not have run"
        )
        for future in self._pending.values():
            if not future.done():
                future.set_exception(lost)

    def _deliver(self, frames: list[bytes]) -> None:
        if frames == HEARTBEAT:
            return
        try:
            reply = wire.decode_reply(frames)
        except wire.ProtocolError as exc:
            # An answer this client cannot read (a status it does not know, say) still ends its request.
            request_id = wire.request_id_of(frames)
            unreadable = self._pending.get(request_id) if request_id is not None else None
            if unreadable is not None and not unreadable.done():
                unreadable.set_exception(ZBatchError(f"the broker's answer could not be read: {exc}"))
            return
        future = self._pending.get(reply.request_id)
        if future is not None and not future.done():
            future.set_result(reply)
