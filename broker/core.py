"""The broker's scheduling core: admission, shedding, dispatch, deadlines, worker liveness.

Theory of operation
-------------------
The core is sans-I/O.  The I/O shell (:mod:`broker.server`) feeds it every
message with the sender's identity (``client_message`` / ``worker_message``)
and calls ``tick`` when ``next_wakeup`` comes; the core appends the messages
to send to ``outbox`` as ``(Peer, identity, frames)`` and never blocks.  The
clock is injected, so tests drive it with fake frames and a fake clock.

A client request goes through these states::

    admission --refused--> answered (overloaded / unknown model / bad request)
        |
        v
    WAITING in its model's FIFO backlog --deadline or no worker--> answered
        |  dispatch: the serving worker with the most free credit (ties:
        v  least recently used) that has room for the request's items
    IN FLIGHT on one worker --worker REPLY--> answered with the worker's reply
        |                   --deadline--> answered "deadline exceeded"; the
        |                                 worker's late reply is dropped
        +--worker dies--> WAITING again at the head of the backlog, while
                          its retry budget lasts; then "worker lost";
                          after two deaths "worker error" (poison input)

A job whose worker died may be what killed it (a poison input).  It is
dispatched again only to an idle worker, which gets nothing else until it
answers: so a poison input takes no innocent neighbours down with it twice,
and its second death charges only itself.

Shedding is decided first, at admission, by counting items: nothing is
queued past ``max_backlog``.  Credit is counted in items: a worker announces
its capacity in READY, each dispatched request takes its items, each REPLY
gives them back.  A request that is answered early (deadline, cancel) keeps
its worker's credit until that worker replies or is declared dead, so the
broker never overfills a worker.

Workers are expired by silence (``heartbeat_ms * heartbeat_liveness``)
whether idle or busy; the core sends them a HEARTBEAT every interval.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import logging
import os
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.limits import ModelLimits
from broker.state import Job, ModelState, WorkerState
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import (
    NORMAL_PRIORITY,
    Cancel,
    Disconnect,
    Drain,
    Heartbeat,
    ProtocolError,
    Ready,
    Reply,
    Request,
    StatsQuery,
    Status,
)

log = logging.getLogger("zbatch.broker")


class Peer(enum.Enum):
    CLIENT = "client"
    WORKER = "worker"


Outgoing = tuple[Peer, bytes, list[bytes]]
RETRY_AFTER_MS = 1_000
POISON_DEATHS = 2  # a request in flight on this many dying workers is treated as the cause
LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """What the core needs to know of the broker's configuration (built by ``BrokerConfig.core_settings``)."""

    max_backlog: int = 256
    priority_reserve: float = 0.25
    timeout_ms: int = 30_000
    max_timeout_ms: int = 60_000
    no_worker_grace_ms: int = 2_000
    heartbeat_ms: int = 1_000
    heartbeat_liveness: int = 3
    max_retries: int = 1
    max_message_bytes: int = 16 * 1024 * 1024
    models: tuple[str, ...] = ()
    model_limits: dict[str, ModelLimits] = field(default_factory=dict)  # models with limits of their own


class BrokerCore:
    def __init__(self, config: CoreSettings, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.started_at = clock()
        self.outbox: list[Outgoing] = []
        self.models = {name: ModelState(name, known=True) for name in config.models}
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[bytes, Job] = {}
        self.by_client: dict[tuple[bytes, bytes], Job] = {}
        self.draining = False
        # For the metrics: the broker's own error answers by status, and workers removed by reason.
        self.rejections: Counter[Status] = Counter()
        self.removals: Counter[str] = Counter()
        self._timers: list[tuple[float, int, Job]] = []
        self._timer_order = itertools.count()
        self._job_ids = itertools.count()
        # Job ids carry a random epoch so a restarted broker never reuses ids a worker still holds.
        self._epoch = os.urandom(4)
        self._default_limits = ModelLimits(config.max_backlog, config.timeout_ms, config.max_timeout_ms)
        self._model_limits = config.model_limits
        self._told_to_register: dict[bytes, float] = {}
        self._next_heartbeat = self.started_at
        self._last_log: dict[str, float] = {}

    # ---------------------------------------------------------------- events

    def client_message(self, client: bytes, frames: list[bytes]) -> None:
        size = sum(map(len, frames))
        try:
            if size > self.config.max_message_bytes:  # refused unread: not even the meta is decoded
                raise ProtocolError(f"message too large: {size} bytes, the limit is {self.config.max_message_bytes}")
            message = wire.decode_client_message(frames)
        except ProtocolError as exc:
            self._client_protocol_error(client, frames, exc)
            return
        if isinstance(message, Request):
            self._admit(client, message)
        elif isinstance(message, Cancel):
            self._cancel(client, message.request_id)
        elif isinstance(message, StatsQuery):
            payload = payloads.encode_payload(self.stats())
            self._send_client(client, Reply(message.request_id, Status.OK, "", payload))

    def worker_message(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            message = wire.decode_worker_message(frames)
        except ProtocolError as exc:
            self._log_limited("bad-worker-frame", "dropped a malformed message from a worker: %s", exc)
            return
        if isinstance(message, Ready):
            self._register(identity, message)
            return
        worker = self.workers.get(identity)
        if worker is None:
            if not isinstance(message, Disconnect):
                self._ask_to_register(identity)
            return
        worker.last_seen = self.clock()
        if isinstance(message, Reply):
            self._worker_reply(worker, message, frames)
        elif isinstance(message, Heartbeat):
            worker.batches.update(message.batches)
        elif isinstance(message, Drain):
            # Ordered delivery makes the acknowledgement a promise: no REQUEST follows it.
            worker.draining = True
            self.outbox.append((Peer.WORKER, identity, wire.encode_drain()))
            log.info("worker %s (%s) is draining %d request(s)", identity.hex(), worker.ready.name,
                     len(worker.in_flight))
        elif isinstance(message, Disconnect):
            self.remove_worker(identity, "disconnected", f"({message.reason or 'no reason given'})",
                               died=not worker.draining)

    def _ask_to_register(self, identity: bytes) -> None:
        """A worker we forgot (expired, or the broker restarted) must send READY again.

        Asked once per heartbeat interval: a reconnecting worker flushes a queue of
        old messages, and one READY is all it needs to send back.
        """
        now = self.clock()
        if now - self._told_to_register.get(identity, float("-inf")) < self.config.heartbeat_ms / 1000:
            return
        if len(self._told_to_register) > 10_000:
            self._told_to_register.clear()  # bound the memory a flood of fake identities can take
        self._told_to_register[identity] = now
        self.outbox.append((Peer.WORKER, identity, wire.encode_disconnect("not registered")))

    def tick(self) -> None:
        """Fire whatever is due: deadlines, worker expiry, heartbeats."""
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, job = heapq.heappop(self._timers)
            self._on_timer(job, now)
        expiry = self._expiry_s()
        for worker in [w for w in self.workers.values() if now - w.last_seen > expiry]:
            self.remove_worker(worker.identity, "silent", f"for {now - worker.last_seen:.1f} s")
        if now >= self._next_heartbeat:
            heartbeat = wire.encode_heartbeat()
            self.outbox.extend((Peer.WORKER, identity, heartbeat) for identity in self.workers)
            self._next_heartbeat = now + self.config.heartbeat_ms / 1000

    def next_wakeup(self) -> float:
        """The clock time at which ``tick`` has something to do."""
        wakeup = self._next_heartbeat
        if self._timers:
            wakeup = min(wakeup, self._timers[0][0])
        if self.workers:
            wakeup = min(wakeup, min(w.last_seen for w in self.workers.values()) + self._expiry_s())
        return wakeup

    def unreachable(self, peer: Peer, identity: bytes) -> None:
        """The shell could not deliver to this peer (it is gone)."""
        if peer is Peer.WORKER:
            self.remove_worker(identity, "unreachable")

    def begin_drain(self) -> None:
        """Stop admitting; work already admitted continues."""
        self.draining = True

    def abandon_all(self, message: str) -> None:
        """Answer every unanswered job now (end of a drain)."""
        for job in list(self.jobs.values()):
            if not job.answered:
                self._answer(job, Status.NO_WORKER, message)

    @property
    def idle(self) -> bool:
        return not any(not job.answered for job in self.jobs.values())

    # ------------------------------------------------------------- admission

    def _admit(self, client: bytes, request: Request) -> None:
        now = self.clock()
        problem = self._refusal(client, request, now)
        if problem is not None:
            status, message = problem
            retry = RETRY_AFTER_MS if status is Status.OVERLOADED else None
            # Shedding is routine under load (the metrics count it); a line per shed request would add to the load.
            level = logging.DEBUG if status is Status.OVERLOADED else logging.INFO
            log.log(level, "refused a request for model %r: %s (%s)", request.model, status.value, message,
                    extra={"request_id": request.trace})
            if request.model in self.models:
                self.models[request.model].answered[status] += 1
            self._send_client(client, Reply(request.request_id, status, message, retry_after_ms=retry))
            return
        model = self.models.get(request.model)
        if model is None:
            model = self.models[request.model] = ModelState(request.model)
        limits = self.limits_for(request.model)
        timeout_ms = min(request.timeout_ms or limits.timeout_ms, limits.max_timeout_ms)
        job_id = self._epoch + struct.pack(">Q", next(self._job_ids))
        job = Job(job_id, client, request.request_id, request.model, request.items,
                  request.payload, now, now + timeout_ms / 1000, request.priority, request.trace)
        self.jobs[job_id] = job
        self.by_client[(client, request.request_id)] = job
        model.enqueue(job)
        if log.isEnabledFor(logging.DEBUG):  # the arguments cost more than routing the request
            log.debug("admitted job %s for model %r: %d item(s), %d ms", job_id.hex(), job.model, job.items,
                      timeout_ms, extra={"request_id": job.trace})
        self._arm(job, job.deadline)
        if not model.workers:
            self._arm(job, now + self.config.no_worker_grace_ms / 1000)
        self._dispatch(model)

    def _refusal(self, client: bytes, request: Request, now: float) -> tuple[Status, str] | None:
        model = self.models.get(request.model)
        if self.draining:
            return Status.OVERLOADED, "the broker is shutting down; retry on another broker or later"
        if (client, request.request_id) in self.by_client:
            return Status.BAD_REQUEST, "request id already in use on this connection; use a new id per request"
        max_backlog = self.limits_for(request.model).max_backlog
        if request.items > max_backlog:
            return (Status.BAD_REQUEST, f"a request may carry at most {max_backlog} items; "
                    f"this one has {request.items}: split it")
        if (model is None or not model.known) and now - self.started_at > self.config.no_worker_grace_ms / 1000:
            known = ", ".join(sorted(self.models)) or "none yet"
            return Status.UNKNOWN_MODEL, f"no worker serves model {request.model!r} (models: {known})"
        limit = self._backlog_limit(max_backlog, request.priority)
        if model is not None and model.backlog_items + request.items > limit:
            return (Status.OVERLOADED, f"model {request.model!r} has {model.backlog_items} items waiting "
                    f"(limit {limit} at priority {request.priority}); retry later")
        return None

    def limits_for(self, model: str) -> ModelLimits:
        return self._model_limits.get(model, self._default_limits)

    def _backlog_limit(self, max_backlog: int, priority: int) -> int:
        """Normal requests fill ``max_backlog``; low ones are refused a reserved share earlier,
        and high ones may use a reserved share beyond it, so they are refused last."""
        share = 1 + self.config.priority_reserve * (NORMAL_PRIORITY - priority)
        return max(1, int(max_backlog * share))

    # -------------------------------------------------------------- dispatch

    def _dispatch(self, model: ModelState) -> None:
        now = self.clock()
        while (job := model.first_waiting()) is not None:
            worker = self._pick_worker(model, job)
            if worker is None:
                return
            model.dequeue(job)
            worker.take(job, now)
            model.dispatched += 1
            model.queue_time.observe(now - job.admitted_at)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("dispatched job %s to worker %s after %.1f ms", job.job_id.hex(), worker.ready.name,
                          (now - job.admitted_at) * 1000, extra={"request_id": job.trace})
            remaining_ms = max(1, round((job.deadline - now) * 1000))
            request = Request(job.job_id, job.model, job.items, job.payload, remaining_ms, job.priority, job.trace)
            self.outbox.append((Peer.WORKER, worker.identity, wire.encode_request(request)))

    @staticmethod
    def _pick_worker(model: ModelState, job: Job) -> WorkerState | None:
        best: WorkerState | None = None
        for worker in model.workers.values():
            if not worker.can_take(job):
                continue
            if best is None or (worker.free_credit, -worker.last_dispatch) > (
                best.free_credit, -best.last_dispatch
            ):
                best = worker
        return best

    # --------------------------------------------------------------- workers

    def _register(self, identity: bytes, ready: Ready) -> None:
        old = self.workers.get(identity)
        if old is not None:
            same_process = (old.ready.host, old.ready.pid) == (ready.host, ready.pid)
            reason = "reconnected" if same_process else "restarted"
            self.remove_worker(identity, reason, "(registered again)", died=not same_process)
        self._told_to_register.pop(identity, None)
        worker = WorkerState(identity, ready, last_seen=self.clock())
        self.workers[identity] = worker
        log.info("worker %s registered: %s pid %s on %s, models %s, capacity %d", identity.hex(),
                 ready.name, ready.pid, ready.device, ", ".join(worker.models), ready.capacity)
        for name in worker.models:
            model = self.models.setdefault(name, ModelState(name))
            model.known = True
            model.workers[identity] = worker
        for name in worker.models:
            self._dispatch(self.models[name])

    def remove_worker(self, identity: bytes, reason: str, detail: str = "", *, died: bool = True) -> None:
        """Forget a worker; its unanswered jobs go back to the head of their backlogs.

        ``reason`` is one word for the metrics (silent, disconnected, unreachable,
        restarted, reconnected); ``detail`` completes it in the log.

        ``died`` charges each job's retry budget: a worker that crashed or went
        silent may have been killed by one of them; a reconnection or a clean
        DISCONNECT did not.
        """
        worker = self.workers.pop(identity, None)
        if worker is None:
            return
        self.removals[reason] += 1
        log.warning("worker %s (%s pid %s) removed: %s %s; %d request(s) in flight", identity.hex(),
                    worker.ready.name, worker.ready.pid, reason, detail, len(worker.in_flight))
        for name in worker.models:
            self.models[name].retire(worker)
        now = self.clock()
        for job in reversed(list(worker.in_flight.values())):
            worker.release(job.job_id)
            self._requeue(job, died)
        for name in worker.models:
            model = self.models[name]
            if not model.workers:
                for job in model.waiting_jobs():
                    self._arm(job, now + self.config.no_worker_grace_ms / 1000)
            self._dispatch(model)

    def _requeue(self, job: Job, died: bool) -> None:
        if job.answered:
            self._forget(job)
            return
        job.attempts += died
        if job.attempts >= POISON_DEATHS:
            self._answer(job, Status.WORKER_ERROR, f"the workers running this request died {job.attempts} "
                         "times; it looks like an input the model cannot survive, so it is not retried")
        elif job.attempts > self.config.max_retries:
            self._answer(job, Status.WORKER_LOST,
                         "the worker running this request died and the retry budget is spent; retry")
        else:
            self.models[job.model].enqueue(job, front=True)
            return
        self._forget(job)

    def _worker_reply(self, worker: WorkerState, reply: Reply, frames: list[bytes]) -> None:
        job = worker.release(reply.request_id)
        if job is None:
            return  # a reply for a job this worker no longer holds: already re-dispatched
        self._forget(job)
        if not job.answered:
            job.answered = True
            self.by_client.pop((job.client, job.request_id), None)
            self.models[job.model].answered[reply.status] += 1
            if reply.status is not Status.OK:
                log.info("worker %s answered job %s: %s (%s)", worker.ready.name, job.job_id.hex(),
                         reply.status.value, reply.message, extra={"request_id": job.trace})
            self.outbox.append((Peer.CLIENT, job.client, wire.readdress_reply(frames, job.request_id)))
        for name in worker.models:
            self._dispatch(self.models[name])

    # ----------------------------------------------------- deadlines, cancel

    def _arm(self, job: Job, when: float) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_order), job))

    def _on_timer(self, job: Job, now: float) -> None:
        if job.answered:
            return
        if now >= job.deadline:
            self._answer(job, Status.DEADLINE_EXCEEDED,
                         f"not finished within its deadline of {(job.deadline - job.admitted_at) * 1000:.0f} ms")
            return
        model = self.models[job.model]
        if job.worker is None and not model.workers:
            if model.known:
                self._answer(job, Status.NO_WORKER, f"no worker is serving model {job.model!r} right now; retry later")
            else:
                self._answer(job, Status.UNKNOWN_MODEL, f"no worker serves model {job.model!r}")
                if model.backlog_items == 0:
                    del self.models[job.model]  # names nobody serves must not pile up

    def _cancel(self, client: bytes, request_id: bytes) -> None:
        job = self.by_client.get((client, request_id))
        if job is None or job.answered:
            return
        self._retire_answered(job)
        if job.worker is not None:
            self.outbox.append((Peer.WORKER, job.worker.identity, wire.encode_cancel(job.job_id)))

    def _answer(self, job: Job, status: Status, message: str) -> None:
        level = logging.WARNING if status in (Status.WORKER_ERROR, Status.WORKER_LOST) else logging.INFO
        log.log(level, "job %s for model %r answered %s: %s", job.job_id.hex(), job.model, status.value, message,
                extra={"request_id": job.trace})
        self._retire_answered(job)
        self.models[job.model].answered[status] += 1
        self._send_client(job.client, Reply(job.request_id, status, message))

    def _retire_answered(self, job: Job) -> None:
        job.answered = True
        self.by_client.pop((job.client, job.request_id), None)
        if job.worker is None:
            self._forget(job)
            self.models[job.model].forget_waiting(job)

    # ------------------------------------------------------------ utilities

    def _forget(self, job: Job) -> None:
        """Done with a job: its deadline timer may outlive it, so let its payload go now."""
        self.jobs.pop(job.job_id, None)
        job.payload = b""

    def _send_client(self, client: bytes, reply: Reply) -> None:
        if reply.status is not Status.OK:
            self.rejections[reply.status] += 1
        self.outbox.append((Peer.CLIENT, client, wire.encode_reply(reply)))

    def _client_protocol_error(self, client: bytes, frames: list[bytes], exc: ProtocolError) -> None:
        self._log_limited("bad-client-frame", "malformed message from a client: %s", exc)
        request_id = wire.request_id_of(frames)
        if request_id is not None:
            self._send_client(client, Reply(request_id, Status.BAD_REQUEST, f"malformed message: {exc}"))

    def _expiry_s(self) -> float:
        return self.config.heartbeat_ms * self.config.heartbeat_liveness / 1000

    def _log_limited(self, key: str, text: str, *args: Any) -> None:
        now = self.clock()
        if now - self._last_log.get(key, float("-inf")) >= LOG_EVERY_S:
            self._last_log[key] = now
            log.warning(text, *args)

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "uptime_s": round(now - self.started_at, 3),
            "draining": self.draining,
            "models": {name: self._model_stats(model) for name, model in self.models.items()},
            "workers": [self._worker_stats(worker, now) for worker in self.workers.values()],
        }

    @staticmethod
    def _model_stats(model: ModelState) -> dict[str, Any]:
        totals = model.batch_totals()
        return {
            "backlog_items": model.backlog_items,
            "workers": len(model.workers),
            "free_credit": sum(max(0, w.free_credit) for w in model.workers.values()),
            "requests": {status.value: count for status, count in model.answered.items()},
            "batches": totals.batches,
            "batched_items": totals.items,
            "mean_batch_size": round(totals.items / totals.batches, 3) if totals.batches else 0.0,
            "cancelled_items": totals.cancelled,
            "expired_items": totals.expired,
        }

    @staticmethod
    def _worker_stats(worker: WorkerState, now: float) -> dict[str, Any]:
        ready = worker.ready
        return {
            "identity": worker.identity.hex(),
            "name": ready.name,
            "host": ready.host,
            "pid": ready.pid,
            "device": ready.device,
            "models": worker.models,
            "capacity": ready.capacity,
            "free_credit": worker.free_credit,
            "in_flight": len(worker.in_flight),
            "draining": worker.draining,
            "last_seen_s": round(now - worker.last_seen, 3),
            "batches": {name: dataclasses.asdict(c) for name, c in worker.batches.items()},
        }
