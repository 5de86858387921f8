"""The worker's I/O shell: broker link, batching policy, inference thread, batch watchdog.

The asyncio loop receives requests, answers, heartbeats (:mod:`worker.link`)
and decides when a batch starts (:class:`worker.batching.BatchPolicy`); the
inference thread (:class:`worker.engine.InferenceThread`) only computes.  So
replies and heartbeats keep flowing while a batch runs.

The lifecycle is :mod:`zbatch.runtime.daemon`'s.  Start: load the model (in
the inference thread), then connect and send READY; systemd hears READY=1
only once the broker has registered the worker.  The broker link, the
inference thread and the batch watchdog are essential.  Drain, in stages:
send DRAIN and keep accepting until the broker acknowledges it (after the
acknowledgement no request can follow), finish and answer everything held
within ``drain_timeout_ms``, send DISCONNECT; close: the socket, then the
context.

Batch watchdog: a batch running longer than ``batch_timeout_ms`` means the
model is stuck.  The worker tells the broker (DISCONNECT, so its requests go
to other workers) and exits with status 70 for its supervisor to restart it.

Several brokers (``--backend`` lists them): one link per broker, each with
its share of the capacity (:mod:`worker.shares`); replies go back over the
link their request came from, and the drain asks every broker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket as socketlib
import time

import zmq
import zmq.asyncio

from worker.assembler import Batch, PendingRequest
from worker.config import WorkerConfig
from worker.engine import InferenceThread, Outcomes
from worker.link import BrokerLink
from worker.metrics import worker_families
from worker.requests import BadPayload, decode_request
from worker.runners import InputError, check_request
from worker.shares import Shares
from worker.slots import ModelSlot, model_slots, ready_infos
from zbatch.protocol import wire
from zbatch.protocol.wire import (
    BrokerToWorkerMessage,
    Cancel,
    Drain,
    Heartbeat,
    Ready,
    Reply,
    Request,
    Status,
)
from zbatch.runtime import daemon
from zbatch.runtime.curve import CurveKeys, client_keys
from zbatch.runtime.logs import LogLimiter
from zbatch.runtime.settings import split_endpoints

log = logging.getLogger("zbatch.worker")
FINAL_FLUSH_S = 0.2
FINAL_LINGER_MS = 1_000
STUCK_EXIT_CODE = daemon.FAULT_EXIT_CODE


class WorkerServer(daemon.Service):
    name = "zbatch-worker"
    log = log

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.freed_memory = config.freed_memory
        self.slots = model_slots(config)
        self.logs = LogLimiter(log, time.monotonic)
        self._context = zmq.asyncio.Context()
        self._engine: InferenceThread | None = None
        self.endpoints = split_endpoints(config.backend)
        self.shares = Shares.of(len(self.endpoints), config.effective_capacity)
        self._links: list[BrokerLink] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._batch_started: float | None = None
        self._queued: Batch | None = None  # a full batch handed to the engine behind the running one
        self._idle_since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._registered = asyncio.Event()
        self._drain_acknowledged = asyncio.Event()
        self._drain_acks: set[int] = set()
        self._drain_sent = False
        self._drained = asyncio.Event()
        self._draining = False

    def status_line(self) -> str:
        served = ", ".join(f"{name}: {slot.batches} batches, {slot.batched_items} items"
                           for name, slot in self.slots.items())
        return f"{served}; {self._held()} request(s) held"

    def metrics(self) -> daemon.MetricsPage:
        return daemon.MetricsPage(self.config.metrics_host, self.config.metrics_port,
                                  lambda: worker_families(self.slots))

    async def start(self) -> daemon.Essentials:
        loop = asyncio.get_running_loop()
        specs = [slot.spec for slot in self.slots.values()]
        self._engine = InferenceThread(specs, self.config.torch_threads, loop, self._batch_done,
                                       self.config.workers, self.config.cores_ledger, self.config.tokenize_ahead)
        await self._engine.start()
        for name, slot in self.slots.items():
            slot.details = self._engine.details.get(name, slot.details)
        curve = client_keys(self.config.curve_server_key_file, self.config.curve_secret_key_file)
        self._links = [self._make_link(index, endpoint, curve) for index, endpoint in enumerate(self.endpoints)]
        links = [loop.create_task(link.run()) for link in self._links]
        watchdog = loop.create_task(self._watch_batches())
        self._tasks = [*links, watchdog]
        log.info("worker %s serving %s on %s, broker %s", self.config.identity, ", ".join(self.slots),
                 self._engine.device, ", ".join(self.endpoints))
        named = {"the broker link": links[0]} if len(links) == 1 else {
            f"the broker link to {endpoint}": task for endpoint, task in zip(self.endpoints, links, strict=True)}
        return {**named, "the inference thread": self._engine.finished, "the batch watchdog": watchdog}

    def _make_link(self, index: int, endpoint: str, curve: CurveKeys | None) -> BrokerLink:
        return BrokerLink(
            self._context, endpoint, self.config.identity.encode(),
            self.config.heartbeat_ms / 1000, self.config.heartbeat_liveness,
            ready=lambda: self._ready_frames(index), heartbeat=lambda: self._heartbeat_frames(index),
            deliver=lambda message: self._deliver(index, message),
            on_registered=lambda: self._link_registered(index), on_lost=lambda: self._link_lost(index),
            curve=curve,
        )

    async def ready(self) -> None:
        """For systemd, ready means loaded and registered with the broker."""
        await self._registered.wait()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for link in self._links:
            link.close(linger_ms=FINAL_LINGER_MS)
        if self._engine is not None:
            self._engine.stop(timeout_s=1.0)
        self._context.term()

    # ------------------------------------------------------------- messages

    def _ready_frames(self, link: int) -> list[bytes]:
        """READY with the whole capacity, or (several brokers) this broker's share, at least 1 (READY's minimum)."""
        assert self._engine is not None
        infos = ready_infos(self.slots.values())
        several = self.shares.several
        capacity = max(1, self.shares.share(link, registering=True)) if several else self.config.effective_capacity
        ready = Ready(infos, capacity, self.config.identity, socketlib.gethostname(), os.getpid(),
                      self._engine.device)
        return wire.encode_ready(ready)

    def _heartbeat_frames(self, link: int) -> list[bytes]:
        counters = {name: slot.counters() for name, slot in self.slots.items()}
        capacity = self.shares.announce(link) if self.shares.several else None
        return wire.encode_heartbeat(Heartbeat(counters, capacity))

    def _link_registered(self, link: int) -> None:
        """A broker took the READY: tell it its exact share, and the others theirs if that changed them."""
        self.shares.set_registered(link, True)
        self._registered.set()
        if self.shares.several:
            self._links[link].send(self._heartbeat_frames(link))
            self._announce_shares()

    def _link_lost(self, link: int) -> None:
        """A broker gave this worker up: skip what it sent that has not started, share its capacity out."""
        self.shares.set_registered(link, False)
        orphans = self.shares.orphan(link)
        if orphans:
            log.warning("broker %s lost: dropping its %d request(s), skipping those not started",
                        self.endpoints[link], len(orphans))
            for local in orphans:
                self._send_replies([r for r in (s.assembler.cancel(local) for s in self.slots.values()) if r])
        self._announce_shares()
        self._check_drain_acknowledged()

    def _announce_shares(self) -> None:
        for link in self.shares.changed():
            self._links[link].send(self._heartbeat_frames(link))

    def _deliver(self, link: int, message: BrokerToWorkerMessage) -> None:
        """Handle one message from a broker; whatever goes wrong with it, answer it and keep serving."""
        local: bytes | None = None
        try:
            if isinstance(message, Request):
                admitted = self.shares.admit(link, message)
                if isinstance(admitted, Reply):  # declined: full with other brokers' work
                    self._links[link].send(wire.encode_reply(admitted))
                    return
                local = admitted.request_id
                self._accept(admitted)
            elif isinstance(message, Cancel):
                local = self.shares.local_id(link, message.request_id)
                replies = (slot.assembler.cancel(local) for slot in self.slots.values())
                self._send_replies([reply for reply in replies if reply is not None])
            elif isinstance(message, Drain):
                self._drain_acks.add(link)
                self._check_drain_acknowledged()
        except Exception:
            self.logs.log("message-failed", logging.ERROR, "handling a %s from the broker failed; it is answered "
                          "worker_error and the worker goes on", type(message).__name__, exc_info=True)
            if isinstance(message, Request) and local is not None:
                self._fail(local, "the worker failed while taking this request; see its log")

    def _fail(self, job_id: bytes, message: str) -> None:
        """Answer a request ``worker_error``, once, whether or not it is held already."""
        held = [slot.assembler.fail(job_id, Status.WORKER_ERROR, message) for slot in self.slots.values()]
        replies = [reply for reply in held if reply is not None]
        self._send_replies(replies or [Reply(job_id, Status.WORKER_ERROR, message)])

    def _send_replies(self, replies: list[Reply]) -> None:
        """Each reply over the link its request came from, under that broker's job id."""
        for reply in replies:
            routed = self.shares.route(reply)
            if routed is not None:
                link, answer = routed
                self._links[link].send(wire.encode_reply(answer))
        if replies and self.shares.several:
            self._announce_shares()  # a lost broker's work ended: its items go to the others

    # -------------------------------------------------------------- batching

    def _accept(self, request: Request) -> None:
        now = time.monotonic()
        slot = self.slots.get(request.model)
        try:
            if slot is None:
                raise BadPayload(f"this worker does not serve model {request.model!r}")
            if any(s.assembler.holds(request.request_id) for s in self.slots.values()):
                raise BadPayload("this worker already holds a job with that id")
            decoded = decode_request(request.payload, request.items, self.config.input_limits)
            check_request(slot.spec.task, decoded.operation, decoded.inputs)
        except (BadPayload, InputError) as exc:
            self.logs.log("refused", logging.INFO, "refused job %s: %s", request.request_id.hex(), exc,
                          request_id=request.trace)
            self._send_replies([Reply(request.request_id, Status.BAD_REQUEST, str(exc))])
            return
        deadline = now + (request.timeout_ms or self.config.drain_timeout_ms) / 1000
        log.debug("accepted job %s for %s: %d item(s)", request.request_id.hex(), request.model, request.items,
                  extra={"request_id": request.trace})
        others_held = len(slot.assembler) > 0
        pending = PendingRequest(request.request_id, decoded.inputs, decoded.parameters, decoded.parameters_key,
                                 deadline, now, request.trace, decoded.operation)
        slot.assembler.add(pending)
        slot.policy.arrived(now, request.items, others_held)
        self._schedule()
        if pending.next_item < len(pending.inputs) and self._engine is not None:
            self._engine.encode_ahead(slot.spec.name, pending)  # it waits: tokenize it meanwhile

    def _schedule(self) -> None:
        """Start a batch if the policy says so, or set a timer for when it will.

        While a batch runs, a full batch (it cannot grow any more) is handed to the engine at once, so that
        it is tokenized and planned in the running batch's shadow (:mod:`worker.encoder`).
        """
        if self._engine is None:
            return
        if self._batch_started is not None:
            if self._queued is None:
                self._queue_full_batch()
            return
        now = time.monotonic()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due: list[tuple[float, float, ModelSlot]] = []  # (run_at, first arrival, slot)
        for slot in self.slots.values():
            self._send_replies(slot.assembler.expire(now))
            first = slot.assembler.first_arrival()
            run_at = slot.policy.run_at(now, slot.assembler.pending_items, first, self._idle_since)
            if run_at is not None:
                due.append((max(run_at, now), first, slot))
        if not due:
            if self._draining and not self._held():
                self._drained.set()
            return
        run_at, _, slot = min(due, key=lambda entry: entry[:2])
        if run_at > now:
            self._timer = asyncio.get_running_loop().call_later(run_at - now, self._schedule)
        elif (batch := slot.assembler.take_batch(slot.max_batch_size)) is not None:
            self._batch_started = now
            self._engine.submit(slot.spec.name, batch)

    def _queue_full_batch(self) -> None:
        assert self._engine is not None
        full = [slot for slot in self.slots.values() if slot.assembler.pending_items >= slot.max_batch_size]
        if not full:
            return
        slot = min(full, key=lambda each: each.assembler.first_arrival())
        self._queued = slot.assembler.take_batch(slot.max_batch_size)
        if self._queued is not None:
            self._engine.submit(slot.spec.name, self._queued)

    def _held(self) -> int:
        return sum(len(slot.assembler) for slot in self.slots.values())

    def _batch_done(self, model: str, batch: Batch, outcomes: Outcomes, elapsed_s: float) -> None:
        self._idle_since = time.monotonic()
        self._batch_started = None if self._queued is None else self._idle_since  # the queued batch starts
        self._queued = None
        slot = self.slots[model]
        slot.batches += 1
        slot.batched_items += len(batch.items)
        slot.batch_sizes.observe(len(batch.items))
        slot.inference_times.observe(elapsed_s)
        log.debug("%s: batch of %d items in %.1f ms", model, len(batch.items), elapsed_s * 1000)
        replies = slot.assembler.complete(batch, outcomes)
        sizes = {item.request.job_id: len(item.request.inputs) for item in batch.items}
        slot.policy.ran(len(batch.items), elapsed_s, sum(sizes[reply.request_id] for reply in replies),
                        self._idle_since)
        self._send_replies(replies)
        self._schedule()

    # ------------------------------------------------------ drain, watchdog

    def _check_drain_acknowledged(self) -> None:
        """Every registered broker acknowledged DRAIN: none will send more."""
        if self._drain_sent and all(i in self._drain_acks or not link.registered
                                    for i, link in enumerate(self._links)):
            self._drain_acknowledged.set()

    async def drain(self) -> None:
        log.info("draining: telling the broker, then finishing %d held request(s)", self._held())
        budget_end = time.monotonic() + self.config.drain_timeout_ms / 1000
        self._drain_sent = True
        for link in self._links:
            link.announce = False
            link.send(wire.encode_drain())
        self._check_drain_acknowledged()  # no broker registered: none can send more
        await _wait(self._drain_acknowledged, budget_end)
        self._draining = True
        self._schedule()
        if self._held() and not await _wait(self._drained, budget_end):
            log.warning("drain timeout: %d request(s) left to the broker", self._held())
        for link in self._links:
            link.send(wire.encode_disconnect("worker stopping"))
        # Let the last replies and the DISCONNECT leave before the connection closes: a peer
        # that reads them in the same TCP segment as the close can lose them (seen with libzmq).
        await asyncio.sleep(FINAL_FLUSH_S)

    async def _watch_batches(self) -> None:
        limit_s = self.config.batch_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, limit_s / 4))
            started = self._batch_started
            if started is not None and time.monotonic() - started > limit_s:
                self._give_up(time.monotonic() - started)

    def _give_up(self, running_s: float) -> None:
        log.error("batch running for %.1f s (limit %d ms): the model is stuck; exiting for a restart",
                  running_s, self.config.batch_timeout_ms)
        for link in self._links:
            link.send(wire.encode_disconnect(f"stuck: a batch ran for {running_s:.0f} s"))
            link.close(linger_ms=FINAL_LINGER_MS)
        self._context.term()
        daemon.exit_now(STUCK_EXIT_CODE)  # the inference thread cannot be stopped; the process must go


async def _wait(event: asyncio.Event, until: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), max(0.0, until - time.monotonic()))
        return True
    except TimeoutError:
        return False
