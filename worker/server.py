"""The worker's I/O shell: broker links, the engine, timers; every decision is the core's.

The asyncio loop receives requests, answers and heartbeats
(:mod:`worker.link`), feeds each event to the sans-I/O core
(:class:`worker.core.WorkerCore`) and carries out the actions it returns:
frames to send, batches for the engine (:class:`worker.engine.InferenceThread`),
requests to tokenize ahead, timers.  The inference thread only computes, so
replies and heartbeats keep flowing while a batch runs.

The lifecycle is :mod:`zbatch.runtime.daemon`'s.  Start: load the model (in
the inference thread), then connect and send READY; systemd hears READY=1
only once the broker has registered the worker.  The broker link, the
inference thread and the batch watchdog are essential.  Drain, in stages:
send DRAIN and keep accepting until the broker acknowledges it (after the
acknowledgement no request can follow), finish and answer everything held
within ``drain_timeout_ms``, send DISCONNECT; close: the socket, then the
context.

Batch watchdog: the core is ticked every second at most; a batch running
longer than ``batch_timeout_ms`` means the model is stuck.  The worker tells the broker (DISCONNECT, so its requests go
to other workers) and exits with status 70 for its supervisor to restart it.

Several brokers (``--backend`` lists them): one link per broker, each with
its share of the capacity (:mod:`worker.shares`); replies go back over the
link their request came from, and the drain asks every broker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import zmq
import zmq.asyncio

from worker.assembler import BatchItem
from worker.config import WorkerConfig
from worker.core import (
    Action,
    CoreSettings,
    DrainAcknowledged,
    Drained,
    Prepare,
    Send,
    Stuck,
    Submit,
    WakeAt,
    WorkerCore,
)
from worker.engine import InferenceThread, Outcomes
from worker.link import BrokerLink
from worker.metrics import worker_families
from worker.runners.phases import process_age_s
from worker.slots import model_slots
from worker.sources import fetch_models
from worker.stages import BatchWork, Prepared
from zbatch.protocol import wire
from zbatch.protocol.wire import BrokerToWorkerMessage
from zbatch.runtime import daemon
from zbatch.runtime.curve import CurveKeys, client_keys
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
        self.slots = model_slots(config.models)
        fetch_models(self.slots)  # each model's local folder, before anything loads
        self.endpoints = split_endpoints(config.backend)
        self._core: WorkerCore | None = None  # once the models are loaded: their batch sizes set the capacity
        self._context = zmq.asyncio.Context()
        self._engine: InferenceThread | None = None
        self._links: list[BrokerLink] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        # Each waiting request's encodings, worked out on the engine's pool (a core's Prepare), by its job id.
        self._prepared: dict[bytes, Future[list[Any]]] = {}
        self._registered = asyncio.Event()
        self._drain_acknowledged = asyncio.Event()
        self._drained = asyncio.Event()

    @property
    def core(self) -> WorkerCore:
        assert self._core is not None, "the core is made once the models are loaded"
        return self._core

    def status_line(self) -> str:
        served = ", ".join(f"{name}: {slot.batches} batches, {slot.batched_items} items"
                           for name, slot in self.slots.items())
        return f"{served}; {self._core.held if self._core else 0} request(s) held"

    def metrics(self) -> daemon.MetricsPage:
        return daemon.MetricsPage(self.config.metrics_host, self.config.metrics_port,
                                  lambda: worker_families(self.slots))

    async def start(self) -> daemon.Essentials:
        loop = asyncio.get_running_loop()
        specs = [slot.spec for slot in self.slots.values()]
        self._engine = InferenceThread(specs, self.config.torch_threads, loop, self._batch_done,
                                       self.config.workers, self.config.cores_ledger_file,
                                       self.config.tokenize_ahead_mode)
        await self._engine.start()
        for name, slot in self.slots.items():
            slot.loaded(self._engine.details.get(name, slot.details), self._engine.batch_sizes[name])
        main = next(iter(self.slots.values()))
        settings = CoreSettings(self.config.effective_capacity(main.max_batch_size), self.config.input_limits,
                                self.config.drain_timeout_ms / 1000, self.config.batch_timeout_ms / 1000)
        self._core = WorkerCore(self.slots, len(self.endpoints), settings, time.monotonic,
                               self._engine.prepared_ahead)
        curve = client_keys(self.config.curve_server_key_file, self.config.curve_secret_key_file)
        self._links = [self._make_link(index, endpoint, curve) for index, endpoint in enumerate(self.endpoints)]
        links = [loop.create_task(link.run()) for link in self._links]
        watchdog = loop.create_task(self._watch_batches())
        self._tasks = [*links, watchdog]
        age = process_age_s()
        log.info("worker %s serving %s on %s, broker %s: READY sent%s", self.config.identity, ", ".join(self.slots),
                 self._engine.device, ", ".join(self.endpoints),
                 f" {age:.1f} s after the process started" if age is not None else "")
        named = {"the broker link": links[0]} if len(links) == 1 else {
            f"the broker link to {endpoint}": task for endpoint, task in zip(self.endpoints, links, strict=True)}
        return {**named, "the inference thread": self._engine.finished, "the batch watchdog": watchdog}

    def _make_link(self, index: int, endpoint: str, curve: CurveKeys | None) -> BrokerLink:
        return BrokerLink(
            self._context, endpoint, self.config.identity.encode(),
            self.config.heartbeat_ms / 1000, self.config.heartbeat_liveness,
            ready=lambda: self._ready_frames(index), heartbeat=lambda: self.core.heartbeat_frames(index),
            deliver=lambda message: self._deliver(index, message),
            on_registered=lambda: self._link_registered(index),
            on_lost=lambda: self._carry_out(self.core.lost(index)),
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

    # ------------------------------------------------------------- events in, actions out

    def _ready_frames(self, link: int) -> list[bytes]:
        assert self._engine is not None
        return wire.encode_ready(self.core.ready_message(link, self._engine.device, self.config.identity))

    def _link_registered(self, link: int) -> None:
        self._registered.set()
        self._carry_out(self.core.registered(link))

    def _deliver(self, link: int, message: BrokerToWorkerMessage) -> None:
        self._carry_out(self.core.message(link, message))

    def _batch_done(self, ticket: int, outcomes: Outcomes, elapsed_s: float) -> None:
        self._carry_out(self.core.batch_done(ticket, outcomes, elapsed_s))

    def _tick(self) -> None:
        self._timer = None
        self._carry_out(self.core.tick())

    def _carry_out(self, actions: list[Action]) -> None:
        """Do what the core decided, in order; no decision is made here."""
        assert self._engine is not None
        for action in actions:
            if isinstance(action, Send):
                self._links[action.link].send(action.frames)
            elif isinstance(action, Submit):
                batch = action.batch
                prepared = tuple(self._prepared_item(item) for item in batch.items)
                self._engine.submit(BatchWork(action.ticket, action.model, batch.operation, batch.parameters,
                                              tuple(batch.inputs), prepared))
            elif isinstance(action, Prepare):
                encodings = self._engine.encode_ahead(action.model, action.inputs, action.parameters,
                                                      action.parameters_key)
                if encodings is not None:
                    self._prepared[action.job_id] = encodings
            elif isinstance(action, WakeAt):
                self._set_timer(action.when)
            elif isinstance(action, Stuck):
                self._give_up(action.running_s)
            elif isinstance(action, DrainAcknowledged):
                self._drain_acknowledged.set()
            elif isinstance(action, Drained):
                self._drained.set()
        for job_id in answered_early(self._prepared, self.core.held, self.core.holds):
            del self._prepared[job_id]

    def _prepared_item(self, item: BatchItem) -> Prepared | None:
        """Where ``item``'s encoding comes from, if its request was prepared ahead (kept until its last item)."""
        request = item.request
        encodings = self._prepared.get(request.job_id)
        if encodings is None:
            return None
        if item.index == len(request.inputs) - 1:
            del self._prepared[request.job_id]
        return Prepared(encodings, item.index)

    def _set_timer(self, when: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None:
            delay = max(0.0, when - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    # ------------------------------------------------------ drain, watchdog

    async def drain(self) -> None:
        log.info("draining: telling the broker, then finishing %d held request(s)", self.core.held)
        budget_end = time.monotonic() + self.config.drain_timeout_ms / 1000
        for link in self._links:
            link.announce = False
        self._carry_out(self.core.start_drain())
        await _wait(self._drain_acknowledged, budget_end)
        if not await _wait(self._drained, budget_end):
            log.warning("drain timeout: %d request(s) left to the broker", self.core.held)
        for link in self._links:
            link.send(wire.encode_disconnect("worker stopping"))
        # Let the last replies and the DISCONNECT leave before the connection closes: a peer
        # that reads them in the same TCP segment as the close can lose them (seen with libzmq).
        await asyncio.sleep(FINAL_FLUSH_S)

    async def _watch_batches(self) -> None:
        """The core's watch: expiries and the batch timeout (rule 6 of :mod:`worker.core`)."""
        limit_s = self.config.batch_timeout_ms / 1000
        while True:
            await asyncio.sleep(min(1.0, limit_s / 4))
            self._carry_out(self.core.tick())

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


def answered_early(prepared: dict[bytes, Any], held: int, holds: Callable[[bytes], bool]) -> list[bytes]:
    """The prepared requests already answered (cancelled or expired before their last item reached the engine).

    Every other prepared request is held, so they are looked for only once more are prepared than held: a look
    at each after every action cost a worker at 32 to 128 clients a scan of its held requests per message.
    """
    if len(prepared) <= held:
        return []
    return [job_id for job_id in prepared if not holds(job_id)]
