"""The worker's I/O shell: a DEALER socket, the batching policy and the inference thread.

The asyncio loop receives requests, answers, heartbeats and decides when a
batch starts (:class:`worker.batching.BatchPolicy`); the inference thread
(:class:`worker.engine.InferenceThread`) only computes.  So replies and
heartbeats keep flowing while a batch runs.

Start: load the model (in the inference thread), then connect and send READY.
Stop (SIGTERM/SIGINT), in stages: stop taking new requests, finish and answer
everything held (up to ``drain_timeout_ms``), send DISCONNECT, close the
socket, then the context.  Requests that reach a draining worker are left to
the broker, which hands them to another worker when the DISCONNECT arrives.
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
from broker.protocol import BatchCounters, Cancel, Heartbeat, ModelInfo, ProtocolError, Ready, Reply, Request, Status
from worker.assembler import Assembler, Batch, PendingRequest
from worker.batching import BatchPolicy
from worker.config import WorkerConfig
from worker.engine import InferenceThread, Outcomes
from worker.models import DEFAULT_MODEL_NAME, ModelSpec, default_model_path

log = logging.getLogger("zbatch.worker")


def model_spec(config: WorkerConfig) -> ModelSpec:
    path = config.model_path or default_model_path()
    default_name = DEFAULT_MODEL_NAME if not config.model_path else path.rstrip("/").split("/")[-1]
    return ModelSpec(config.model_name or default_name, path, config.task, config.device, config.dtype)


class WorkerServer:
    def __init__(self, config: WorkerConfig, context: zmq.asyncio.Context | None = None) -> None:
        self.config = config
        self.spec = model_spec(config)
        self.policy = BatchPolicy(config.max_batch_size, config.max_batch_delay_ms / 1000)
        self.assembler = Assembler()
        self.counters = BatchCounters()
        self._context = context or zmq.asyncio.Context()
        self._owns_context = context is None
        self._socket: zmq.asyncio.Socket | None = None
        self._sender: zmq.Socket | None = None
        self._engine: InferenceThread | None = None
        self._busy = False
        self._idle_since = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._stop = asyncio.Event()
        self._drained = asyncio.Event()
        self._draining = False

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._engine = InferenceThread(self.spec, self.config.effective_torch_threads, loop, self._batch_done)
        await self._engine.start()
        self._connect()
        tasks = [loop.create_task(self._receive_loop()), loop.create_task(self._heartbeat_loop())]
        log.info("worker %s serving %s on %s, broker %s", self.config.identity, self.spec.name,
                 self._engine.device, self.config.backend)
        try:
            await self._stop.wait()
            await self._drain()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._engine.stop(timeout_s=1.0)
            self._close()
        log.info("worker %s stopped", self.config.identity)

    # ------------------------------------------------------------ connection

    def _connect(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, self.config.identity.encode())
        sock.setsockopt(zmq.LINGER, 1_000)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(self.config.backend)
        self._socket = sock
        self._sender = zmq.Socket.shadow(sock.underlying)
        self._send(protocol.encode_ready(self._ready()))

    def _ready(self) -> Ready:
        assert self._engine is not None
        info = ModelInfo(self.spec.name, self.spec.task, self.config.max_batch_size)
        return Ready((info,), self.config.effective_capacity, self.config.identity,
                     socketlib.gethostname(), os.getpid(), self._engine.device)

    def _send(self, frames: list[bytes]) -> None:
        assert self._sender is not None
        try:
            self._sender.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("dropped a message to the broker: send queue full")

    def _close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=1_000)
        if self._owns_context:
            self._context.term()

    async def _receive_loop(self) -> None:
        assert self._socket is not None
        while True:
            frames = await self._socket.recv_multipart()
            try:
                message = protocol.decode_broker_to_worker(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            if isinstance(message, Request):
                self._accept(message)
            elif isinstance(message, Cancel):
                reply = self.assembler.cancel(message.request_id)
                if reply is not None:
                    self._send(protocol.encode_reply(reply))
            elif isinstance(message, protocol.Disconnect) and not self._draining:
                log.warning("the broker does not know this worker (%s); registering again", message.reason)
                self._send(protocol.encode_ready(self._ready()))

    async def _heartbeat_loop(self) -> None:
        while True:
            self._send(protocol.encode_heartbeat(Heartbeat({self.spec.name: self.counters})))
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    # -------------------------------------------------------------- requests

    def _accept(self, request: Request) -> None:
        if self._draining:
            return  # the broker re-dispatches it when our DISCONNECT arrives
        now = time.monotonic()
        try:
            inputs, parameters = _parse_payload(request)
        except ValueError as exc:
            self._send(protocol.encode_reply(Reply(request.request_id, Status.BAD_REQUEST, str(exc))))
            return
        deadline = now + (request.timeout_ms or 0) / 1000
        key = msgpack.packb(sorted(parameters.items()), use_bin_type=True, default=str)
        self.assembler.add(PendingRequest(request.request_id, inputs, parameters, key, deadline, now))
        self.policy.arrived(now, len(inputs))
        self._schedule()

    def _schedule(self) -> None:
        """Start a batch if the policy says so, or set a timer for when it will."""
        if self._busy or self._engine is None:
            return
        now = time.monotonic()
        for reply in self.assembler.expire(now):
            self._send(protocol.encode_reply(reply))
        run_at = self.policy.run_at(now, self.assembler.pending_items, self.assembler.first_arrival(),
                                    self._idle_since)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if run_at is None:
            if self._draining and not len(self.assembler):
                self._drained.set()
            return
        if run_at > now:
            self._timer = asyncio.get_running_loop().call_later(run_at - now, self._schedule)
            return
        batch = self.assembler.take_batch(self.config.max_batch_size)
        if batch is not None:
            self._busy = True
            self._engine.submit(batch)

    def _batch_done(self, batch: Batch, outcomes: Outcomes, elapsed_s: float) -> None:
        self._busy = False
        self._idle_since = time.monotonic()
        self.counters = BatchCounters(self.counters.batches + 1, self.counters.items + len(batch.items))
        log.debug("batch of %d items in %.1f ms", len(batch.items), elapsed_s * 1000)
        for reply in self.assembler.complete(batch, outcomes):
            self._send(protocol.encode_reply(reply))
        self._schedule()

    # ----------------------------------------------------------------- drain

    async def _drain(self) -> None:
        log.info("draining: finishing %d held request(s)", len(self.assembler))
        self._draining = True
        self._schedule()
        if len(self.assembler) or self._busy:
            try:
                await asyncio.wait_for(self._drained.wait(), self.config.drain_timeout_ms / 1000)
            except TimeoutError:
                log.warning("drain timeout: %d request(s) left to the broker", len(self.assembler))
        self._send(protocol.encode_disconnect("worker stopping"))


def _parse_payload(request: Request) -> tuple[list[Any], dict[str, Any]]:
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
