"""The worker's I/O shell: broker link, batching policy, inference thread, watchdog.

The asyncio loop receives requests, answers, heartbeats (:mod:`worker.link`)
and decides when a batch starts (:class:`worker.batching.BatchPolicy`); the
inference thread (:class:`worker.engine.InferenceThread`) only computes.  So
replies and heartbeats keep flowing while a batch runs.

Start: load the model (in the inference thread), then connect and send READY.
Stop (SIGTERM/SIGINT), in stages: send DRAIN and keep accepting until the
broker acknowledges it (after the acknowledgement no request can follow),
finish and answer everything held within ``drain_timeout_ms``, send
DISCONNECT, close the socket, then the context.

Watchdog: a batch running longer than ``batch_timeout_ms`` means the model
is stuck.  The worker tells the broker (DISCONNECT, so its requests go to
other workers) and exits with status 70 for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket as socketlib
import time
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from broker import protocol
from broker.protocol import (
    BatchCounters,
    BrokerToWorkerMessage,
    Cancel,
    Drain,
    Heartbeat,
    ModelInfo,
    ProtocolError,
    Ready,
    Reply,
    Request,
    Status,
)
from worker.assembler import Assembler, Batch, PendingRequest
from worker.batching import BatchPolicy
from worker.config import WorkerConfig
from worker.engine import InferenceThread, Outcomes
from worker.link import BrokerLink
from worker.models import DEFAULT_MODEL_NAME, ModelSpec, default_model_path

log = logging.getLogger("zbatch.worker")
STUCK_EXIT_CODE = 70  # EX_SOFTWARE: systemd's Restart=on-failure restarts us


def model_spec(config: WorkerConfig) -> ModelSpec:
    path = config.model_path or default_model_path()
    default_name = DEFAULT_MODEL_NAME if not config.model_path else os.path.basename(path.rstrip("/"))
    return ModelSpec(config.model_name or default_name, path, config.task, config.device, config.dtype)


class WorkerServer:
    def __init__(self, config: WorkerConfig, context: zmq.asyncio.Context | None = None) -> None:
        self.config = config
        self.spec = model_spec(config)
        self.policy = BatchPolicy(config.max_batch_size, config.max_batch_delay_ms / 1000)
        self.assembler = Assembler()
        self.batches = 0
        self.batched_items = 0
        self._context = context or zmq.asyncio.Context()
        self._engine: InferenceThread | None = None
        self._link: BrokerLink | None = None
        self._batch_started: float | None = None
        self._idle_since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._stop = asyncio.Event()
        self._drain_acknowledged = asyncio.Event()
        self._drained = asyncio.Event()
        self._draining = False

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._engine = InferenceThread(self.spec, self.config.effective_torch_threads, loop, self._batch_done)
        await self._engine.start()
        self._link = BrokerLink(
            self._context, self.config.backend, self.config.identity.encode(),
            self.config.heartbeat_ms / 1000, self.config.heartbeat_liveness,
            ready=self._ready_frames, heartbeat=self._heartbeat_frames, deliver=self._deliver,
        )
        tasks = [loop.create_task(self._link.run()), loop.create_task(self._watchdog())]
        log.info("worker %s serving %s on %s, broker %s", self.config.identity, self.spec.name,
                 self._engine.device, self.config.backend)
        try:
            await self._stop.wait()
            await self._drain()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._link.close(linger_ms=1_000)
            self._engine.stop(timeout_s=1.0)
            self._context.term()
        log.info("worker %s stopped", self.config.identity)

    # ------------------------------------------------------------- messages

    def _ready_frames(self) -> list[bytes]:
        assert self._engine is not None
        info = ModelInfo(self.spec.name, self.spec.task, self.config.max_batch_size)
        ready = Ready((info,), self.config.effective_capacity, self.config.identity,
                      socketlib.gethostname(), os.getpid(), self._engine.device)
        return protocol.encode_ready(ready)

    def _heartbeat_frames(self) -> list[bytes]:
        skipped = self.assembler.skipped_items
        counters = BatchCounters(self.batches, self.batched_items,
                                 skipped[Status.CANCELLED], skipped[Status.DEADLINE_EXCEEDED])
        return protocol.encode_heartbeat(Heartbeat({self.spec.name: counters}))

    def _deliver(self, message: BrokerToWorkerMessage) -> None:
        if isinstance(message, Request):
            self._accept(message)
        elif isinstance(message, Cancel):
            self._send_replies([r for r in [self.assembler.cancel(message.request_id)] if r])
        elif isinstance(message, Drain):
            self._drain_acknowledged.set()

    def _send_replies(self, replies: list[Reply]) -> None:
        assert self._link is not None
        for reply in replies:
            self._link.send(protocol.encode_reply(reply))

    # -------------------------------------------------------------- batching

    def _accept(self, request: Request) -> None:
        now = time.monotonic()
        try:
            if self.assembler.holds(request.request_id):
                raise ValueError("this worker already holds a job with that id")
            inputs, parameters = parse_payload(request)
        except ValueError as exc:
            self._send_replies([Reply(request.request_id, Status.BAD_REQUEST, str(exc))])
            return
        deadline = now + (request.timeout_ms or self.config.drain_timeout_ms) / 1000
        key = msgpack.packb(sorted(parameters.items()), use_bin_type=True, default=str)
        self.assembler.add(PendingRequest(request.request_id, inputs, parameters, key, deadline, now))
        self.policy.arrived(now, len(inputs))
        self._schedule()

    def _schedule(self) -> None:
        """Start a batch if the policy says so, or set a timer for when it will."""
        if self._batch_started is not None or self._engine is None:
            return
        now = time.monotonic()
        self._send_replies(self.assembler.expire(now))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        run_at = self.policy.run_at(now, self.assembler.pending_items, self.assembler.first_arrival(),
                                    self._idle_since)
        if run_at is None:
            if self._draining and not len(self.assembler):
                self._drained.set()
        elif run_at > now:
            self._timer = asyncio.get_running_loop().call_later(run_at - now, self._schedule)
        elif (batch := self.assembler.take_batch(self.config.max_batch_size)) is not None:
            self._batch_started = now
            self._engine.submit(batch)

    def _batch_done(self, batch: Batch, outcomes: Outcomes, elapsed_s: float) -> None:
        self._batch_started = None
        self._idle_since = time.monotonic()
        self.batches += 1
        self.batched_items += len(batch.items)
        log.debug("batch of %d items in %.1f ms", len(batch.items), elapsed_s * 1000)
        self._send_replies(self.assembler.complete(batch, outcomes))
        self._schedule()

    # ------------------------------------------------------ drain, watchdog

    async def _drain(self) -> None:
        assert self._link is not None
        log.info("draining: telling the broker, then finishing %d held request(s)", len(self.assembler))
        budget_end = time.monotonic() + self.config.drain_timeout_ms / 1000
        self._link.announce = False
        self._link.send(protocol.encode_drain())
        await _wait(self._drain_acknowledged, budget_end)
        self._draining = True
        self._schedule()
        if len(self.assembler) and not await _wait(self._drained, budget_end):
            log.warning("drain timeout: %d request(s) left to the broker", len(self.assembler))
        self._link.send(protocol.encode_disconnect("worker stopping"))

    async def _watchdog(self) -> None:
        limit_s = self.config.batch_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, limit_s / 4))
            started = self._batch_started
            if started is not None and time.monotonic() - started > limit_s:
                self._give_up(time.monotonic() - started)

    def _give_up(self, running_s: float) -> None:
        assert self._link is not None
        log.error("batch running for %.1f s (limit %d ms): the model is stuck; exiting for a restart",
                  running_s, self.config.batch_timeout_ms)
        self._link.send(protocol.encode_disconnect(f"stuck: a batch ran for {running_s:.0f} s"))
        self._link.close(linger_ms=1_000)
        self._context.term()
        os._exit(STUCK_EXIT_CODE)  # the inference thread cannot be stopped; the process must go


async def _wait(event: asyncio.Event, until: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), max(0.0, until - time.monotonic()))
        return True
    except TimeoutError:
        return False


def parse_payload(request: Request) -> tuple[list[Any], dict[str, Any]]:
    """The request's inputs and parameters; ValueError says what is wrong with them."""
    try:
        body = protocol.decode_payload(request.payload)
    except ProtocolError as exc:
        raise ValueError(f"payload: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise ValueError("payload must be a map with a list of 'inputs'")
    inputs, parameters = body["inputs"], body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError("'parameters' must be a map")
    if len(inputs) != request.items:
        raise ValueError(f"items says {request.items} but the payload has {len(inputs)} inputs")
    return inputs, parameters


async def serve(config: WorkerConfig) -> None:
    server = WorkerServer(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.request_stop)
    await server.run()
