"""The asyncio client for the brokers' frontends: the gateway uses it, and so can you.

One DEALER socket per broker carries many requests at once (pipelining):
each request gets a fresh id, a future waits for the REPLY with that id, and
one :class:`~zbatch.runtime.sockets.PolledSockets` reads every socket and
matches replies to futures as they arrive.  Statuses other than ``ok``
become typed exceptions (:class:`ZBatchError` subclasses) carrying the
broker's message.

If no broker is connected, a request fails at once with
:class:`BrokerUnavailable` instead of waiting (``IMMEDIATE`` plus a
non-blocking send); if a reply never comes, the wait ends at the request's
timeout plus a grace period for the broker's own deadline answer.

Several brokers (``endpoint="tcp://a:5555,tcp://b:5555"`` or a list;
PROTOCOL.md 6.6): each request goes to the live broker with the fewest items
outstanding (:mod:`zbatch.client.brokers`).  Every broker is sent a HEARTBEAT
each ``heartbeat_ms``; one silent for ``heartbeat_ms × heartbeat_liveness``,
or whose connection drops, is dead until it answers again.  What was
outstanding at a dead broker is sent again to a live one (``replay``), or
fails with :class:`BrokerUnavailable`.  With one broker there is nowhere
else to send: a dropped connection is taken for a broker restarting (``zbatch
serve`` and systemd restart it), so what was outstanding there is sent to it
again once it is back (``replay``), and new requests wait for it, each within
its own deadline and for at most ``restart_wait_ms`` after the drop (a
restart delay and a start, longer than the liveness window a silent broker
gets).  A restarted broker has lost what it held, and a broker that kept
running sees a new connection: either way the request runs again and has one
answer.  The overload breaker
(:mod:`zbatch.client.breaker`) keeps each broker's verdicts apart: a request
one broker would refuse goes to another rather than being refused here.
What the client does as a broker goes and comes back is in
:mod:`zbatch.client.failover`; the sending, waiting and reading here.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import struct
import time
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.asyncio

from zbatch.client.breaker import ADMITTED, OverloadBreaker
from zbatch.client.brokers import BrokerSet
from zbatch.client.catalog import ModelCatalog
from zbatch.client.errors import BadRequest, BrokerUnavailable, WorkerError, ZBatchError, raise_for_status
from zbatch.client.failover import HEARTBEAT, BrokerLoss, Pending
from zbatch.client.stats import merge_stats
from zbatch.client.tokenizing import TimeLeft, Tokenizers, send_tokenized
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Reply, Request, Status
from zbatch.runtime.curve import CurveKeys
from zbatch.runtime.settings import split_endpoints
from zbatch.runtime.sockets import PolledSockets, Socket, open_socket

GROUPED = wire.HEADERS[wire.Command.REPLIES]
SEND_RETRY_S = 0.005  # while the connection to the broker is being made
# One broker, its connection dropped: how long requests wait for it to come back.  A restart is a delay
# (zbatch serve's 1 s, systemd's RestartSec of 2 s in scripts/systemd) and a start, seconds on a loaded host.
RESTART_WAIT_MS = 10_000
REPLY_GRACE_MS = 2_000  # past a request's deadline, how long the broker's own deadline answer may take to come
StatsByBroker = dict[str, dict[str, Any] | ZBatchError]
# Answers another broker may better: no worker there now, or none that registered the model with it yet
# (a broker that came back knows only the models whose workers registered with it again).
ELSEWHERE = frozenset({Status.NO_WORKER, Status.UNKNOWN_MODEL})


def sendable_payload(body: dict[str, Any]) -> bytes:
    """A request's payload (PROTOCOL.md 5.1); BadRequest, saying why, for inputs or parameters msgpack cannot carry."""
    try:
        return payloads.encode_payload(body)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequest(f"inputs or parameters cannot be sent: {exc}") from None


class AsyncClient(BrokerLoss):
    """Pipelined requests to one broker, or spread over several; use as ``async with``."""

    def __init__(
        self,
        endpoint: str | Sequence[str] = "tcp://127.0.0.1:5555",
        *,
        context: zmq.asyncio.Context | None = None,
        timeout_ms: int = 30_000,
        reply_grace_ms: int = REPLY_GRACE_MS,
        connect_timeout_ms: int = 500,
        overload_retries: int = 0,
        retry_backoff_ms: int = 50,
        fail_fast_overload: bool = True,
        curve: CurveKeys | None = None,
        heartbeat_ms: int = 1_000,
        heartbeat_liveness: int = 3,
        restart_wait_ms: int = RESTART_WAIT_MS,
        replay: bool = True,
        tokenize: bool = False,
    ) -> None:
        """``endpoint``: one broker's frontend, or several (a comma-separated string or a list).

        ``curve``: the brokers' public key and this client's key pair, for brokers with CURVE on.

        ``fail_fast_overload``: once a broker refuses a request as overloaded, refuse here, at once,
        the requests it would refuse too (as large or larger, with as short a deadline or shorter, at
        the same priority or lower) until its ``retry_after_ms`` has passed, and never longer than
        ``heartbeat_ms`` unless the broker refuses such a request again; a few go through meanwhile as
        probes, and an admission ends the verdict (see :mod:`zbatch.client.breaker`).

        With several brokers: ``heartbeat_ms`` and ``heartbeat_liveness`` say how soon a dead or
        hung broker is given up (PROTOCOL.md 6.4), and ``replay`` whether its requests are sent
        again to another broker (inference has no side effects) or fail with BrokerUnavailable.

        With one broker: ``restart_wait_ms`` says how long after its connection drops requests wait for it
        to come back (a supervisor restarting it) before they fail with BrokerUnavailable; what was
        outstanding there is sent again once it is back.

        ``tokenize``: :meth:`infer` sends texts as token ids, made here with the model's own tokenizer
        (fetched once from its workers), where its workers announce one (:mod:`zbatch.client.tokenizing`):
        the workers' CPU goes to the model instead, this process's to the tokenizer.  Same answers.
        """
        self.endpoints = split_endpoints(endpoint)
        if not self.endpoints:
            raise ValueError("AsyncClient needs at least one broker endpoint, such as tcp://127.0.0.1:5555")
        self.endpoint = ",".join(self.endpoints)
        self.connect_timeout_ms = connect_timeout_ms
        self.overload_retries = overload_retries
        self.retry_backoff_ms = retry_backoff_ms
        self.timeout_ms = timeout_ms
        self.reply_grace_ms = reply_grace_ms
        self.replay = replay
        self.restart_wait_s = restart_wait_ms / 1000
        self.brokers = BrokerSet(self.endpoints, time.monotonic, heartbeat_s=heartbeat_ms / 1000,
                                 liveness=heartbeat_liveness)
        self._breaker = OverloadBreaker(time.monotonic, heartbeat_ms / 1000) if fail_fast_overload else None
        self._context = context or zmq.asyncio.Context.instance()
        # With CURVE, a refused key never completes the handshake: requests fail fast.
        self._sockets = [open_socket(self._context, zmq.DEALER, connect=end, immediate=True, curve=curve)
                         for end in self.endpoints]
        # Connection events arrive on PAIR sockets read with the replies: drops, and completed handshakes:
        # several brokers, a heartbeat at once so a broker back rejoins without waiting; one, the requests
        # its drop stranded go to it again.
        events = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        self._monitors: list[Socket] = []
        for socket in self._sockets:
            monitor = f"inproc://zbatch-client-monitor.{socket.FD}"
            socket.monitor(monitor, events)
            self._monitors.append(open_socket(self._context, zmq.PAIR, connect=monitor))
        self._pending: dict[bytes, Pending] = {}
        self._stranded: dict[bytes, float] = {}  # one broker: requests outstanding when its connection dropped
        self._dropped_at: float | None = None  # one broker: when its connection dropped, until it is back
        self._prefix = os.urandom(4)
        self._counter = itertools.count()
        self._poller: PolledSockets | None = None
        self._catalog = ModelCatalog()
        self._tokenizers = Tokenizers(where="this client") if tokenize else None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Read from the brokers, and heartbeat them, from now on rather than from the first request.

        A client that has sent nothing yet then still hears which brokers answer, so one that hangs before
        the first request is given up within the liveness window instead of holding that request while the
        window runs (each gateway process calls this at its start)."""
        self._ensure_reader()

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
        time_left = TimeLeft(timeout_ms, self.timeout_ms)

        async def send(inputs: list[Any], parameters: dict[str, Any]) -> Reply:
            payload = sendable_payload({"inputs": inputs, "parameters": parameters})
            return await self._request_retried(model, payload, len(inputs), time_left.next_ms(), priority, trace)

        if self._tokenizers is None:
            reply = await send(inputs, parameters or {})
        else:
            reply = await send_tokenized(self._tokenizers, self._catalog, self, model, inputs, parameters or {}, send)
        raise_for_status(reply)
        try:
            outputs = payloads.decode_payload(reply.payload)["outputs"]
        except (wire.ProtocolError, KeyError, TypeError) as exc:
            raise WorkerError(f"the worker sent an unreadable result ({exc})") from None
        return list(outputs)

    async def prepare_tokenizer(self, model: str) -> bool:
        """With ``tokenize``: fetch ``model``'s tokenizer now, so that its next requests leave as token ids; whether
        they will (False: ``tokenize`` is off, the model's workers announce no tokenizer, or it cannot be fetched)."""
        if self._tokenizers is None:
            return False
        info = self._catalog.known(self, model)
        if info is None:  # not in the last answer, however recent: ask now, and wait for the answer (bounded)
            await self._catalog.wait_for_refresh(self, None)
            info = self._catalog.known(self, model)
        return await self._tokenizers.prepared(self, model, None if info is None else info.tokenizer)

    async def _request_retried(self, model: str, payload: bytes, items: int, timeout_ms: int | None, priority: int,
                               trace: str) -> Reply:
        """:meth:`request`, with an ``overloaded`` answer retried as :meth:`infer` says."""
        for attempt in itertools.count():
            reply = await self.request(model, payload, items=items, timeout_ms=timeout_ms, priority=priority,
                                       trace=trace)
            if reply.status is not Status.OVERLOADED or attempt >= self.overload_retries:
                break
            backoff_ms = self.retry_backoff_ms * 2**attempt * random.uniform(0.5, 1.5)
            await asyncio.sleep(max(backoff_ms, reply.retry_after_ms or 0) / 1000)
        return reply

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
        request = Request(self._new_id(), model, items, payload, timeout_ms, priority, trace, grouped=True)
        own_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        pending = Pending(request.request_id, asyncio.get_running_loop().create_future(), -1, request,
                           time.monotonic() + own_ms / 1000, own_ms)
        refusal = await self._place(pending)
        if refusal is not None:
            return refusal
        reply = await self._wait(pending, own_ms + self.reply_grace_ms)
        if self._breaker is not None:
            self._learn(self._breaker, pending, reply)
        return reply

    @staticmethod
    def _learn(breaker: OverloadBreaker, pending: Pending, reply: Reply) -> None:
        """What the answer tells the breaker about the broker that gave it: a refusal, or an admission."""
        request = pending.request
        assert request is not None
        key = (pending.answered_by, request.model)
        if reply.status is Status.OVERLOADED:
            breaker.refused(key, request.items, pending.timeout_ms, request.priority, reply.retry_after_ms)
        elif reply.status in ADMITTED:
            breaker.admitted(key, request.items, pending.timeout_ms, request.priority, pending.sent_at)

    async def stats(self, *, timeout_ms: int = 2_000) -> dict[str, Any]:
        """The broker's statistics: models, backlogs, workers, batches.

        With several brokers, the merged view of :func:`zbatch.client.stats.merge_stats`, each
        broker's own under ``brokers``; it raises only if no broker answers.
        """
        if len(self.endpoints) == 1:
            return await self._stats_of(0, timeout_ms)
        return merge_stats(await self.stats_by_broker(timeout_ms=timeout_ms))

    async def stats_by_broker(self, *, timeout_ms: int = 2_000) -> StatsByBroker:
        """Every broker's statistics, or the error it gave, by endpoint; all asked at once."""
        answers = await asyncio.gather(*(self._stats_of(i, timeout_ms) for i in range(len(self.endpoints))),
                                       return_exceptions=True)
        result: StatsByBroker = {}
        for endpoint, answer in zip(self.endpoints, answers, strict=True):
            if isinstance(answer, ZBatchError | dict):
                result[endpoint] = answer
            else:
                raise answer  # a cancellation or a bug, not an answer
        return result

    async def close(self) -> None:
        await self._catalog.close()
        if self._tokenizers is not None:
            await self._tokenizers.close()
        if self._poller is not None:
            self._poller.close()
            self._poller = None
        for pending in self._pending.values():
            pending.future.cancel()
        self._pending.clear()
        for socket, monitor in zip(self._sockets, self._monitors, strict=True):
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)

    def _new_id(self) -> bytes:
        return self._prefix + struct.pack(">Q", next(self._counter))

    # ------------------------------------------------------------ sending

    async def _place(self, pending: Pending) -> Reply | None:
        """Send the request to the best live broker its breaker lets through; a Reply: refused here.

        A broker whose verdicts cover the request may still take it as their probe, when no other can.
        A broker whose connection is still being made is skipped; if none can take it, try again
        every few milliseconds for ``connect_timeout_ms``, then fail fast.
        """
        assert pending.request is not None
        self._ensure_reader()
        request = pending.request
        frames = wire.encode_request(request)
        started = time.monotonic()
        while True:
            candidates = self.brokers.order()
            if not candidates:
                raise BrokerUnavailable(self._nowhere_text())
            wait_ms: dict[int, int] = {}  # the brokers whose verdicts cover this request: their time left
            for index in candidates:
                if (ms := self._covered(index, pending)) is not None:
                    wait_ms[index] = ms
                elif self._send(index, pending, frames):
                    return None
            breaker = self._breaker
            for index in wait_ms:  # each holds verdicts: one may let it through as its probe
                if breaker is not None and breaker.probe((index, request.model)) and self._send(index, pending, frames):
                    return None
            # Every broker would refuse it; or those that would not cannot be reached, and the others would.
            give_up_at = self._connect_deadline(pending, started)
            if len(wait_ms) == len(candidates) or (wait_ms and time.monotonic() >= give_up_at):
                return self._refused_here(request, min(wait_ms.values()))
            if time.monotonic() >= give_up_at:
                raise BrokerUnavailable(self._nowhere_text())
            await asyncio.sleep(SEND_RETRY_S)

    def _connect_deadline(self, pending: Pending, started: float) -> float:
        """Until when a request first tried at ``started`` waits for a connection: ``connect_timeout_ms``;
        for a lone broker whose connection dropped, ``restart_wait_ms`` after the drop (it is likely
        restarting); never past the request's own deadline."""
        give_up_at = started + self.connect_timeout_ms / 1000
        if self._dropped_at is not None:
            give_up_at = max(give_up_at, self._dropped_at + self.restart_wait_s)
        return min(give_up_at, pending.deadline) if pending.deadline else give_up_at

    def _covered(self, index: int, pending: Pending) -> int | None:
        """How long the verdicts of broker ``index`` that cover the request have left (ms); None: none do."""
        request = pending.request
        if self._breaker is None or request is None:
            return None
        return self._breaker.refusing((index, request.model), request.items, pending.timeout_ms, request.priority)

    def _send(self, index: int, pending: Pending, frames: list[bytes]) -> bool:
        """Send a request to broker ``index`` and wait for its answer there; False if it cannot go now."""
        if not self._try_send(index, frames):
            return False
        pending.broker, pending.sent_at = index, time.monotonic()
        self._pending[pending.request_id] = pending
        self.brokers[index].outstanding += pending.items
        return True

    @staticmethod
    def _refused_here(request: Request, retry_after_ms: int) -> Reply:
        return Reply(b"", Status.OVERLOADED, f"model {request.model!r} is overloaded: the broker refused a request "
                     f"at least as large, with a deadline at least as short, moments ago, and expects room for it in "
                     f"{retry_after_ms} ms; retry then", retry_after_ms=retry_after_ms)

    def _nowhere_text(self) -> str:
        if len(self.endpoints) == 1:
            return f"the broker at {self.endpoint} is not connected; start zbatch-broker or check the address"
        return (f"no broker of {self.endpoint} is connected and answering heartbeats; start zbatch-broker "
                "or check the addresses")

    async def _wait(self, pending: Pending, wait_ms: int) -> Reply:
        """The answer, or BrokerUnavailable after ``wait_ms``; a caller who gives up cancels the request."""
        request_id = pending.request_id
        future = pending.future
        # A timer on the future itself: asyncio.wait_for wraps it in more futures and callbacks,
        # which cost more than the rest of the exchange.
        timer = asyncio.get_running_loop().call_later(wait_ms / 1000, self._give_up, pending, wait_ms)
        try:
            return await future
        except asyncio.CancelledError:
            self._try_send(pending.broker, wire.encode_cancel(request_id))
            raise
        finally:
            timer.cancel()
            self._forget(request_id, pending)

    def _forget(self, request_id: bytes, pending: Pending) -> None:
        self._stranded.pop(request_id, None)
        if self._pending.get(request_id) is pending:
            del self._pending[request_id]
            self.brokers[pending.broker].outstanding -= pending.items
        if pending.future.done() and not pending.future.cancelled():
            pending.future.exception()  # a connection lost before the send failed: already reported by the raise

    def _give_up(self, pending: Pending, wait_ms: int) -> None:
        if not pending.future.done():
            endpoint = self.endpoints[pending.broker]
            pending.future.set_exception(BrokerUnavailable(f"no answer from the broker at {endpoint} within "
                                                           f"{wait_ms} ms"))

    def _try_send(self, index: int, frames: list[bytes]) -> bool:
        """A non-blocking send: no future per message; False when it cannot go now (or the client is closed)."""
        if self._poller is None:
            return False
        try:
            self._poller.send(self._sockets[index], frames)
        except zmq.Again:
            return False
        return True

    async def _stats_of(self, index: int, timeout_ms: int) -> dict[str, Any]:
        """One broker's STATS answer, asked of that broker only."""
        self._ensure_reader()
        if not self.brokers[index].live and self.brokers.watch:
            raise BrokerUnavailable(self._dead_text(index))
        request_id = self._new_id()
        pending = Pending(request_id, asyncio.get_running_loop().create_future(), index)
        frames = wire.encode_stats_query(request_id)
        give_up_at = time.monotonic() + self.connect_timeout_ms / 1000
        while not self._try_send(index, frames):
            if time.monotonic() >= give_up_at:
                raise BrokerUnavailable(f"the broker at {self.endpoints[index]} is not connected; start "
                                        "zbatch-broker or check the address")
            await asyncio.sleep(SEND_RETRY_S)
        self._pending[request_id] = pending
        reply = await self._wait(pending, timeout_ms)
        raise_for_status(reply)
        stats: dict[str, Any] = payloads.decode_payload(reply.payload)
        return stats

    # ------------------------------------------------------------ reading

    def _ensure_reader(self) -> None:
        """Replies and connection events are read on the loop that asks; a new loop gets a new reader."""
        loop = asyncio.get_running_loop()
        if self._poller is not None and self._poller.loop is loop and not self._poller.stopped.done():
            return
        if self._poller is not None:
            self._poller.close()
        handlers = {}
        for index, (socket, monitor) in enumerate(zip(self._sockets, self._monitors, strict=True)):
            handlers[socket] = lambda frames, i=index: self._deliver(i, frames)
            handlers[monitor] = lambda frames, i=index: self._on_event(i, frames)
        self.brokers.restart()
        self._poller = PolledSockets(handlers, after_wake=self._watch if self.brokers.watch else None)
        self._poller.stopped.add_done_callback(self._reading_stopped)

    def _reading_stopped(self, stopped: asyncio.Future[None]) -> None:
        """A reply handler failed: fail what is pending with its error; the next request reads again."""
        if stopped.cancelled() or stopped.exception() is None:
            return
        error = stopped.exception()
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(BrokerUnavailable(
                    f"reading replies from {self.endpoints[pending.broker]} failed: {error!r}"))

    def _deliver(self, index: int, frames: list[bytes]) -> None:
        if self.brokers.watch and self.brokers.heard(index):
            self._rejoined(index)
        if frames == HEARTBEAT:
            return
        if frames and frames[0] == GROUPED:  # several answers in one message (PROTOCOL.md 3.10): each on its own
            try:
                answers = wire.split_grouped(frames)
            except wire.ProtocolError:
                return  # which requests it answers cannot be known: they end at their deadlines
            for answer in answers:
                self._answered(index, answer)
            return
        self._answered(index, frames)

    def _answered(self, index: int, frames: list[bytes]) -> None:
        """One REPLY from broker ``index``: the end of its request, unless a late duplicate or sent elsewhere."""
        try:
            reply = wire.decode_reply(frames)
        except wire.ProtocolError as exc:
            # An answer this client cannot read (a status it does not know, say) still ends its request.
            request_id = wire.request_id_of(frames)
            unreadable = self._pending.get(request_id) if request_id is not None else None
            if unreadable is not None and unreadable.broker == index and not unreadable.future.done():
                unreadable.future.set_exception(ZBatchError(f"the broker's answer could not be read: {exc}"))
            return
        pending = self._pending.get(reply.request_id)
        if pending is None or pending.future.done():
            return  # a late duplicate: the request has its answer
        if index == pending.broker:
            if reply.status in ELSEWHERE and self._elsewhere(reply.request_id, pending):
                return  # a broker without workers (one just back, say): another one may have some
            pending.answered_by = index
            pending.future.set_result(reply)
        elif index in pending.moved_from and reply.status is Status.OK:
            pending.answered_by = index
            pending.future.set_result(reply)  # the first answer wins: the broker it was moved to can stop
            self._try_send(pending.broker, wire.encode_cancel(reply.request_id))
