"""The broker's scheduling core: admission, shedding, dispatch, deadlines, worker liveness.

Theory of operation
-------------------
The core is sans-I/O.  The I/O shell (:mod:`broker.server`) feeds it every
message with the sender's identity (``client_message`` / ``worker_message``)
and calls ``tick`` when ``next_wakeup`` comes; the core appends the messages
to send to ``outbox`` as ``(Peer, identity, frames)`` and never blocks.  The
clock is injected, so tests drive it with fake frames and a fake clock.
``next_wakeup`` is the earliest work still owed: a job answered before its
deadline leaves no wake behind (``tick`` drops its timer).

A client request goes through these phases (:class:`broker.state.Phase`; a
job holds one, and ``broker.state.TRANSITIONS`` lists its legal moves)::

    admission --refused--> answered at once, no job (overloaded / unknown model / bad request)
        |
        v
    WAITING in its model's FIFO backlog --deadline, no worker, cancel--> DONE
        |  dispatch: the serving worker with the most free credit (ties:
        v  least recently used) that has room for the request's items
    DISPATCHED on one worker --worker REPLY--> DONE, with the worker's reply
        |                    --deadline, cancel--> ANSWERED: the worker keeps its
        |                                credit until it replies (the late reply
        |                                is dropped) or dies, then DONE
        +--worker dies or declines--> WAITING again at the head of the backlog,
                          while its retry budget lasts; then "worker lost"; a
                          crash while it ran alone: "worker error" (poison)

Between a worker letting go of a request it has not answered and the core's
decision (forward the reply, retry, or give up) the job is RETURNED, within
that one event.

A job whose worker died may be what killed it (a poison input).  It is
dispatched again only to an idle worker, which gets nothing else until it
answers: so a poison input takes no innocent neighbours down with it twice.
If that worker crashes too (its connection drops, or it reports itself
stuck), the input is the likely cause and the job is answered "worker
error".  A worker that merely goes silent (its host or network is gone)
says nothing about the input: the job is retried while the budget lasts.

Shedding is decided first, at admission (:mod:`broker.admission`), in units
of time: a request is refused when the work ahead of it, at the service rate
its model's workers measure (:mod:`broker.rates`), would pass its deadline;
items and payload bytes are counted too, as bounds on memory.  Admission and
dispatch are **work-conserving** (PROTOCOL.md 6.1)::

    No request is refused for load while a worker of its model has free credit
    for it and nothing of its priority or higher waits at the broker.

Whatever rule would refuse a request for load first asks the model whether
it would be dispatched at once (``ModelState.room_for``), and admits it if
so; the payload bytes held for the model are the one bound that still
refuses then, since credit counts items.  Dispatch keeps the other half:
after every event that frees credit or changes the head of a backlog (a
reply, a registration, a share, a death, a waiting request answered or
cancelled) the head goes to a worker that can take it, so nothing waits
that a worker could take.  tests/broker/test_work_conserving.py holds the
core to both through random sequences of events.
Credit is counted in items: a worker announces its capacity in READY, each
dispatched request takes its items, each REPLY gives them back.  A request
that is answered early (deadline, cancel) keeps its worker's credit until
that worker replies or is declared dead, so the broker never overfills a
worker; its payload is let go at once.  A worker still holding a request
``OVERDUE_S`` after the request's deadline is removed as stuck (the sweep
every ``SWEEP_EVERY_S`` finds it).

A worker must not answer with a status only the broker may give, nor
``cancelled`` unasked (``STRAYS``): that work was not done, and the worker is
at fault, not the input.  The job goes back to the head of its backlog, for
another worker, charging its retry budget; with the budget spent, or no
other worker for its model, it is answered ``worker_lost`` naming the worker.

Memory is bounded by configuration: backlogs in items and bytes, unanswered
requests per client connection, models per worker (at decode), and models
nobody serves are forgotten after ``FORGET_MODEL_S``, and at once, oldest
first, past ``MAX_WORKERLESS_MODELS`` of them.

A worker's answers to a batch may come grouped in one REPLIES message, and a
client that sends its requests ``grouped`` gets the answers forwarded to it
by one worker message grouped too (PROTOCOL.md 3.10): fewer messages per
request for every peer.  Each grouped answer is handled as its own REPLY.
Only a worker whose READY says ``grouped`` is sent requests marked so.

Workers are expired by silence (``heartbeat_ms * heartbeat_liveness``)
whether idle or busy; the core sends them a HEARTBEAT every interval.
Clients may send HEARTBEAT too, and get one back.
"""

from __future__ import annotations

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

from broker import admission, stats
from broker.admission import Refusal
from broker.limits import ModelLimits
from broker.rates import ServiceRate
from broker.state import Job, ModelState, Phase, Step, WorkerState
from zbatch.protocol import wire
from zbatch.protocol.wire import (
    Cancel,
    Disconnect,
    Drain,
    GroupedReplies,
    Heartbeat,
    ProtocolError,
    Ready,
    Reply,
    Request,
    StatsQuery,
    Status,
)
from zbatch.runtime.logs import LogLimiter

log = logging.getLogger("zbatch.broker")


class Peer(enum.Enum):
    CLIENT = "client"
    WORKER = "worker"


Outgoing = tuple[Peer, bytes, list[bytes]]
Grouping = dict[bytes, list[tuple[bytes, bytes, bytes]]]  # by client: (request id, meta, payload) to send grouped
OVERDUE_S = 120.0  # a worker still holding a request this long after its deadline is stuck
FORGET_MODEL_S = 300.0  # a model nobody serves or waits for is forgotten this long after its last worker left
MAX_WORKERLESS_MODELS = 1_024  # past this many, the oldest idle workerless models are forgotten at once
SWEEP_EVERY_S = 10.0  # how often overdue workers and idle models are looked for
CRASHES = frozenset({"disconnected", "unreachable", "restarted"})  # removals that may be a job's doing
# Statuses a worker may not answer with (cancelled: unless the broker cancelled): the work was not done.
STRAYS = frozenset({Status.CANCELLED, Status.OVERLOADED, Status.UNKNOWN_MODEL, Status.NO_WORKER, Status.WORKER_LOST})


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """What the core needs to know of the broker's configuration (built by ``BrokerConfig.core_settings``)."""

    max_backlog: int = 262_144
    max_backlog_bytes: int = 128 * 1024 * 1024
    max_queue_ms: int = 0
    cold_backlog: int = 512
    priority_reserve: float = 0.25
    deadline_headroom: float = 0.2
    timeout_ms: int = 30_000
    max_timeout_ms: int = 60_000
    no_worker_grace_ms: int = 2_000
    heartbeat_ms: int = 1_000
    heartbeat_liveness: int = 3
    max_retries: int = 1
    max_message_bytes: int = 16 * 1024 * 1024
    max_client_requests: int = 4_096
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
        self.unanswered: Counter[bytes] = Counter()  # by client connection
        self.draining = False
        # For the metrics: the broker's own error answers by status, and workers removed by reason.
        self.rejections: Counter[Status] = Counter()
        self.removals: Counter[str] = Counter()
        self.logs = LogLimiter(log, clock)
        self._timers: list[tuple[float, int, Job]] = []
        self._timer_order = itertools.count()
        self._job_ids = itertools.count()
        # Job ids carry a random epoch so a restarted broker never reuses ids a worker still holds.
        self._epoch = os.urandom(4)
        self._default_limits = ModelLimits(config.max_backlog, config.max_backlog_bytes, config.timeout_ms,
                                           config.max_timeout_ms, config.max_queue_ms, config.cold_backlog)
        self._told_to_register: dict[bytes, float] = {}
        self._workerless: dict[str, None] = {}  # models whose last worker left, oldest first
        self._next_heartbeat = self.started_at
        self._next_sweep = self.started_at + SWEEP_EVERY_S

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
            self._answer_stats(client, message.request_id)
        elif isinstance(message, Heartbeat):
            self.outbox.append((Peer.CLIENT, client, wire.encode_heartbeat()))

    def worker_message(self, identity: bytes, frames: list[bytes]) -> None:
        try:
            message = wire.decode_worker_message(frames)
        except ProtocolError as exc:
            self.logs.log("bad-worker-frame", logging.WARNING, "dropped a malformed message from a worker: %s", exc)
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
            self._worker_reply(worker, message, frames[2])
        elif isinstance(message, GroupedReplies):
            grouping: Grouping = {}
            for reply, meta in zip(message.replies, message.metas, strict=True):
                self._worker_reply(worker, reply, meta, grouping)
            self._send_grouped(grouping)
        elif isinstance(message, Heartbeat):
            self._worker_heartbeat(worker, message)
        elif isinstance(message, Drain):
            # Ordered delivery makes the acknowledgement a promise: no REQUEST follows it.
            worker.draining = True
            self._measure_rates(worker)
            self.outbox.append((Peer.WORKER, identity, wire.encode_drain()))
            log.info("worker %s (%s) is draining %d request(s)", identity.hex(), worker.ready.name,
                     len(worker.in_flight))
        elif isinstance(message, Disconnect):
            self.remove_worker(identity, "disconnected", f"({message.reason or 'no reason given'})",
                               died=not worker.draining)

    def _worker_heartbeat(self, worker: WorkerState, message: Heartbeat) -> None:
        # Counters only for the models it serves: other names would pile up.
        now = self.clock()
        for name, counters in message.batches.items():
            if name in worker.ready_models:
                worker.batches[name] = counters
                since = self.models[name].backlogged_since
                worker.rates.setdefault(name, ServiceRate()).heartbeat(counters, now, since)
        if message.capacity is not None:
            worker.shared = True  # a worker of several brokers: this one gets its part of it
            if message.capacity != worker.capacity:
                worker.capacity = message.capacity
                self._dispatch_to(worker)
        self._measure_rates(worker)

    def _measure_rates(self, worker: WorkerState) -> None:
        for name in worker.models:
            self.models[name].measure_rate()

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
        """Fire whatever is due: deadlines, worker expiry, heartbeats, the sweep of overdue workers and idle models."""
        now = self.clock()
        timers = self._timers
        # A settled job's timer is dropped as soon as it is the earliest, not fired at its deadline: most jobs are
        # answered long before it, and waking for each of them cost the broker one wake a request.
        while timers and (timers[0][0] <= now or not timers[0][2].owed):
            _, _, job = heapq.heappop(timers)
            self._on_timer(job, now)
        expiry = self._expiry_s()
        for worker in [w for w in self.workers.values() if now - w.last_seen > expiry]:
            self.remove_worker(worker.identity, "silent", f"for {now - worker.last_seen:.1f} s")
        if now >= self._next_heartbeat:
            heartbeat = wire.encode_heartbeat()
            self.outbox.extend((Peer.WORKER, identity, heartbeat) for identity in self.workers)
            self._next_heartbeat = now + self.config.heartbeat_ms / 1000
        if now >= self._next_sweep:
            self._remove_overdue_workers(now)
            self._forget_idle_models(now)
            self._next_sweep = now + SWEEP_EVERY_S

    def next_wakeup(self) -> float:
        """The clock time at which ``tick`` has something to do."""
        wakeup = min(self._next_heartbeat, self._next_sweep)
        if self._timers:
            wakeup = min(wakeup, self._timers[0][0])
        if self.workers:
            wakeup = min(wakeup, min(w.last_seen for w in self.workers.values()) + self._expiry_s())
        return wakeup

    def unreachable(self, peer: Peer, identity: bytes) -> None:
        """The shell could not deliver to this peer: a worker is gone; a client is not reading."""
        if peer is Peer.WORKER:
            self.remove_worker(identity, "unreachable")
        else:
            self.logs.log("client-not-reading", logging.WARNING, "dropped an answer to client %s: it is gone or "
                          "not reading (its send queue is full)", identity.hex())

    def begin_drain(self) -> None:
        """Stop admitting; work already admitted continues."""
        self.draining = True

    def abandon_all(self, message: str) -> None:
        """Answer every unanswered job now (end of a drain)."""
        for job in list(self.jobs.values()):
            if job.owed:
                self._answer(job, Status.NO_WORKER, message)

    @property
    def idle(self) -> bool:
        return not any(job.owed for job in self.jobs.values())

    # ------------------------------------------------------------- admission

    def _admit(self, client: bytes, request: Request) -> None:
        if (client, request.request_id) in self.by_client:
            # Any answer would carry the live request's id and settle it: the duplicate gets none.
            self.logs.log("duplicate-id", logging.WARNING, "dropped a request from client %s whose id is in use "
                          "by an unanswered request on the same connection", client.hex(),
                          request_id=request.trace)
            return
        now = self.clock()
        refusal = self._refusal(client, request, now)
        if refusal is not None:
            self._refuse(client, request, refusal)
            return
        model = self.models.get(request.model)
        if model is None:
            model = self.models[request.model] = ModelState(request.model)
        timeout_ms = self._timeout_ms(request)
        job_id = self._epoch + struct.pack(">Q", next(self._job_ids))
        job = Job(job_id, client, request.request_id, request.model, request.items,
                  request.payload, now, now + timeout_ms / 1000, request.priority, request.trace,
                  grouped=request.grouped)
        self.jobs[job_id] = job
        self.by_client[(client, request.request_id)] = job
        self.unanswered[client] += 1
        model.held_bytes += len(job.payload)
        if model.rate is not None:
            job.expected = now + (model.ahead_of(job.priority) + job.items) / model.rate
        model.enqueue(job)
        if log.isEnabledFor(logging.DEBUG):  # the arguments cost more than routing the request
            log.debug("admitted job %s for model %r: %d item(s), %d ms", job_id.hex(), job.model, job.items,
                      timeout_ms, extra={"request_id": job.trace})
        self._arm(job, job.deadline)
        if not model.workers:
            self._arm(job, now + self.config.no_worker_grace_ms / 1000)
        self._dispatch(model)

    def _refusal(self, client: bytes, request: Request, now: float) -> Refusal | None:
        """PROTOCOL.md section 6.1, in order (the duplicate id, rule 2, is handled before)."""
        if self.draining:
            return Refusal(Status.OVERLOADED, "the broker is shutting down; retry on another broker or later")
        limits = self.limits_for(request.model)
        reserve = self.config.priority_reserve
        model = self.models.get(request.model)
        if (refusal := admission.too_large(request, limits, reserve)) is not None:
            return refusal
        if (model is None or not model.known) and now - self.started_at > self.config.no_worker_grace_ms / 1000:
            return admission.unknown_model(request.model, list(self.models))
        if (refusal := admission.client_saturated(self.unanswered[client],
                                                  self.config.max_client_requests)) is not None:
            return refusal
        if model is None:  # a model no worker has announced yet, within the grace: it waits for one
            return None
        refusal = admission.memory_full(request, model, limits, reserve) or admission.too_slow(
            request, model, self._timeout_ms(request), limits, reserve, self.config.deadline_headroom, now,
            self.config.heartbeat_ms)
        if (refusal is not None and model.room_for(request.items, request.priority)
                and admission.bytes_fit(request, model, limits, reserve)):
            return None  # work-conserving: a worker has credit for it and nothing ahead of it waits
        return refusal

    def _timeout_ms(self, request: Request) -> int:
        """The request's deadline from now: its own, or the model's default, at most the model's longest."""
        limits = self.limits_for(request.model)
        return min(request.timeout_ms or limits.timeout_ms, limits.max_timeout_ms)

    def _refuse(self, client: bytes, request: Request, refusal: Refusal) -> None:
        # Shedding is routine under load (the metrics count it); a line per shed request would add to the load.
        if refusal.status is Status.OVERLOADED:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("refused a request for model %r: %s", request.model, refusal.message,
                          extra={"request_id": request.trace})
        else:
            self.logs.log(f"refused-{refusal.status.value}", logging.INFO, "refused a request for model %r: %s (%s)",
                          request.model, refusal.status.value, refusal.message, request_id=request.trace)
        if request.model in self.models:
            self.models[request.model].answered[refusal.status] += 1
        self._send_client(client, Reply(request.request_id, refusal.status, refusal.message,
                                        retry_after_ms=refusal.retry_after_ms))

    def limits_for(self, model: str) -> ModelLimits:
        return self.config.model_limits.get(model, self._default_limits)

    # -------------------------------------------------------------- dispatch

    def _dispatch(self, model: ModelState) -> None:
        now = self.clock()
        while (job := model.first_waiting()) is not None:
            worker = self._pick_worker(model, job)
            if worker is None:
                break
            model.dequeue(job)
            worker.take(job, now)
            model.in_flight_items += job.items
            model.dispatched += 1
            model.queue_time.observe(now - job.admitted_at)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("dispatched job %s to worker %s after %.1f ms", job.job_id.hex(), worker.ready.name,
                          (now - job.admitted_at) * 1000, extra={"request_id": job.trace})
            remaining_ms = max(1, round((job.deadline - now) * 1000))
            request = Request(job.job_id, job.model, job.items, job.payload, remaining_ms, job.priority, job.trace,
                              grouped=worker.ready.grouped)
            self.outbox.append((Peer.WORKER, worker.identity, wire.encode_request(request)))
        model.note_backlog(now)

    @staticmethod
    def _pick_worker(model: ModelState, job: Job) -> WorkerState | None:
        best: WorkerState | None = None
        avoid = job.avoid if len(model.workers) > 1 else None  # a worker that answered it wrongly, if any other
        for worker in model.workers.values():
            if not worker.can_take(job) or worker.identity == avoid:
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
            model.workerless_since = None
            self._workerless.pop(name, None)
            model.workers[identity] = worker
            model.measure_rate()  # it counts at the mean of the measured workers from now on
        for name in worker.models:
            self._dispatch(self.models[name])

    def remove_worker(self, identity: bytes, reason: str, detail: str = "", *, died: bool = True) -> None:
        """Forget a worker; its unanswered jobs go back to the head of their backlogs.

        ``reason`` is one word for the metrics (silent, disconnected, unreachable,
        restarted, reconnected, overdue); ``detail`` completes it in the log.

        ``died`` charges each job's retry budget: a worker that crashed or went
        silent may have been killed by one of them; a reconnection or a clean
        DISCONNECT did not.  A crash (``CRASHES``) of a worker running a job
        alone is blamed on that job.
        """
        worker = self.workers.pop(identity, None)
        if worker is None:
            return
        self.removals[reason] += 1
        log.warning("worker %s (%s pid %s) removed: %s %s; %d request(s) in flight", identity.hex(),
                    worker.ready.name, worker.ready.pid, reason, detail, len(worker.in_flight))
        now = self.clock()
        for name in worker.models:
            self.models[name].retire(worker, now)
            if not self.models[name].workers and name not in self.config.models:
                self._workerless.pop(name, None)  # to the end: the newest
                self._workerless[name] = None
        crashed = died and reason in CRASHES
        for job in reversed(list(worker.in_flight.values())):
            isolated = job.isolated
            self._release(worker, job.job_id)
            self._requeue(job, died, blamed=crashed and isolated)
        for name in worker.models:
            model = self.models[name]
            if not model.workers:
                for job in model.waiting_jobs():
                    self._arm(job, now + self.config.no_worker_grace_ms / 1000)
            self._dispatch(model)
        if len(self._workerless) > MAX_WORKERLESS_MODELS:
            self._forget_idle_models(now)

    def _requeue(self, job: Job, died: bool, *, blamed: bool) -> None:
        if job.phase is Phase.DONE:  # answered while its worker held it
            self._forget(job)
            return
        job.deaths += died
        job.expected = 0.0  # a retry's wait says nothing of the prediction
        if blamed:
            self._answer(job, Status.WORKER_ERROR, f"the workers running this request died {job.deaths} times, "
                         "the last one running it alone; it looks like an input the model cannot survive, so it "
                         "is not retried")
        elif job.deaths + job.strays > self.config.max_retries:
            self._answer(job, Status.WORKER_LOST, f"the workers running this request were lost {job.deaths} "
                         "time(s) and the retry budget is spent; retry")
        else:
            self.models[job.model].enqueue(job, front=True)

    def _release(self, worker: WorkerState, job_id: bytes) -> Job | None:
        job = worker.release(job_id)
        if job is not None:
            self.models[job.model].in_flight_items -= job.items
        return job

    def _worker_reply(self, worker: WorkerState, reply: Reply, meta: bytes, grouping: Grouping | None = None) -> None:
        """One answer of a worker; ``grouping`` collects those of a REPLIES for clients that take them grouped."""
        job = self._release(worker, reply.request_id)
        if job is None:
            return  # a reply for a job this worker no longer holds: already re-dispatched
        if reply.status is Status.OK:
            worker.rates.setdefault(job.model, ServiceRate()).answered_ok(job.items)
        if reply.status is Status.DECLINED:
            self._declined(worker, job)
        elif job.phase is Phase.DONE:  # answered while this worker held it: the late reply is dropped
            self._forget(job)
        elif reply.status in STRAYS:
            self._stray(worker, job, reply)
        else:
            self._forward(worker, job, reply, meta, grouping)
        self._dispatch_to(worker)

    def _forward(self, worker: WorkerState, job: Job, reply: Reply, meta: bytes, grouping: Grouping | None) -> None:
        """The worker's answer to the client, its meta frame and payload untouched."""
        if reply.status is Status.OK:
            self.models[job.model].answered_at(job, self.clock())
        self._settle(job)
        self.models[job.model].answered[reply.status] += 1
        if reply.status is not Status.OK:
            self.logs.log(f"worker-{reply.status.value}", logging.INFO, "worker %s answered job %s: %s (%s)",
                          worker.ready.name, job.job_id.hex(), reply.status.value, reply.message,
                          request_id=job.trace)
        if job.grouped and grouping is not None:
            grouping.setdefault(job.client, []).append((job.request_id, meta, reply.payload))
        else:
            self.outbox.append((Peer.CLIENT, job.client, wire.readdressed_reply(job.request_id, meta, reply.payload)))
        self._forget(job)

    def _send_grouped(self, grouping: Grouping) -> None:
        """The answers one REPLIES brought for clients that take them grouped: few messages each."""
        for client, answers in grouping.items():
            self.outbox += [(Peer.CLIENT, client, frames) for frames in wire.group_answers(answers)]

    def _stray(self, worker: WorkerState, job: Job, reply: Reply) -> None:
        """A status the worker may not send (``STRAYS``): the work was not done, through the worker's fault.
        Another worker gets it while the retry budget lasts; else the client is told which worker failed it."""
        what = (f"worker {worker.label} answered {reply.status.value!r}"
                + (" although the request was not cancelled" if reply.status is Status.CANCELLED else
                   ", a status only the broker gives"))
        self.logs.log(f"stray-{reply.status.value}", logging.WARNING, "job %s: %s", job.job_id.hex(), what,
                      request_id=job.trace)
        job.strays += 1
        job.avoid = worker.identity
        job.expected = 0.0  # a retry's wait says nothing of the prediction
        others = any(identity != worker.identity for identity in self.models[job.model].workers)
        if job.deaths + job.strays > self.config.max_retries or not others:
            why = "the retry budget is spent" if others else "no other worker serves the model"
            self._answer(job, Status.WORKER_LOST, f"{what}; the request was not run, and {why}; retry")
        else:
            self.models[job.model].enqueue(job, front=True)

    def _declined(self, worker: WorkerState, job: Job) -> None:
        """The worker is full with other brokers' work: the job goes back to the head of its backlog,
        its retry budget untouched, and this worker gets no more than it holds until it announces its share."""
        worker.declined += 1
        worker.capacity = min(worker.capacity, worker.in_flight_items)
        self._measure_rates(worker)  # a share of 0 takes no work: it counts for nothing
        if log.isEnabledFor(logging.DEBUG):
            log.debug("worker %s declined job %s: full", worker.ready.name, job.job_id.hex(),
                      extra={"request_id": job.trace})
        if job.phase is Phase.DONE:
            self._forget(job)
        else:
            self.models[job.model].enqueue(job, front=True)

    def _dispatch_to(self, worker: WorkerState) -> None:
        for name in worker.models:
            self._dispatch(self.models[name])

    def _remove_overdue_workers(self, now: float) -> None:
        """A worker still holding an answered request long after its deadline is stuck, or lies about its work."""
        for worker in list(self.workers.values()):
            if any(job.phase is Phase.ANSWERED and now - job.deadline > OVERDUE_S
                   for job in worker.in_flight.values()):
                self.remove_worker(worker.identity, "overdue",
                                   f"(holds a request more than {OVERDUE_S:.0f} s past its deadline)")

    def _forget_idle_models(self, now: float) -> None:
        """Names no worker serves and nobody waits for must not pile up: after a while, or past a count."""
        excess = len(self._workerless) - MAX_WORKERLESS_MODELS
        for name in list(self._workerless):
            model = self.models.get(name)
            if model is None or model.workers:
                del self._workerless[name]
                continue
            old = now - (model.workerless_since or now) >= FORGET_MODEL_S
            if not old and excess <= 0:
                break  # the rest left later
            if model.idle():
                del self.models[name], self._workerless[name]
                excess -= 1

    # ----------------------------------------------------- deadlines, cancel

    def _arm(self, job: Job, when: float) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_order), job))

    def _on_timer(self, job: Job, now: float) -> None:
        if not job.owed:
            return
        if now >= job.deadline:
            if job.phase is Phase.DISPATCHED:  # late on a worker: at least this late against its prediction
                self.models[job.model].answered_at(job, now)
            self._answer(job, Status.DEADLINE_EXCEEDED,
                         f"not finished within its deadline of {(job.deadline - job.admitted_at) * 1000:.0f} ms")
            return
        model = self.models[job.model]
        if job.phase is Phase.WAITING and not model.workers:
            if model.known:
                self._answer(job, Status.NO_WORKER, f"no worker is serving model {job.model!r} right now; retry later")
            else:
                self._answer(job, Status.UNKNOWN_MODEL, f"no worker serves model {job.model!r}")
                if model.backlog_items == 0:
                    del self.models[job.model]  # names nobody serves must not pile up

    def _cancel(self, client: bytes, request_id: bytes) -> None:
        job = self.by_client.get((client, request_id))
        if job is None or not job.owed:
            return
        self._settle(job)
        if job.worker is not None:  # ANSWERED on a worker: tell it to stop
            self.outbox.append((Peer.WORKER, job.worker.identity, wire.encode_cancel(job.job_id)))

    def _answer(self, job: Job, status: Status, message: str) -> None:
        level = logging.WARNING if status in (Status.WORKER_ERROR, Status.WORKER_LOST) else logging.INFO
        self.logs.log(f"answered-{status.value}", level, "job %s for model %r answered %s: %s", job.job_id.hex(),
                      job.model, status.value, message, request_id=job.trace)
        self._settle(job)
        self.models[job.model].answered[status] += 1
        self._send_client(job.client, Reply(job.request_id, status, message))

    def _settle(self, job: Job) -> None:
        """The client has its answer (or cancelled): nothing more is owed, and the payload can go."""
        was_waiting = job.phase is Phase.WAITING
        job.advance(Step.SETTLE)
        self.by_client.pop((job.client, job.request_id), None)
        self.unanswered[job.client] -= 1
        if self.unanswered[job.client] <= 0:
            del self.unanswered[job.client]
        model = self.models[job.model]
        if was_waiting:
            model.forget_waiting(job)
            model.note_backlog(self.clock())
        if job.phase is Phase.DONE:
            self._forget(job)
        else:  # ANSWERED, its worker's credit still taken until the worker lets go
            self._drop_payload(job)  # never dispatched again: answered jobs are not retried
        if was_waiting:
            self._dispatch(model)  # it may have been the head that no worker had room for

    # ------------------------------------------------------------ utilities

    def _forget(self, job: Job) -> None:
        """Done with a job: its timers may outlive it, so let its payload go now."""
        self.jobs.pop(job.job_id, None)
        self._drop_payload(job)

    def _drop_payload(self, job: Job) -> None:
        if job.payload:
            model = self.models.get(job.model)
            if model is not None:
                model.held_bytes -= len(job.payload)
            job.payload = b""

    def _send_client(self, client: bytes, reply: Reply) -> None:
        if reply.status is not Status.OK:
            self.rejections[reply.status] += 1
        self.outbox.append((Peer.CLIENT, client, wire.encode_reply(reply)))

    def _answer_stats(self, client: bytes, request_id: bytes) -> None:
        if (client, request_id) in self.by_client:  # an ok under a live request's id would settle it
            self.logs.log("duplicate-id", logging.WARNING, "dropped a STATS from client %s whose id is in use by an "
                          "unanswered request on the same connection", client.hex())
            return
        self.outbox.append((Peer.CLIENT, client, wire.encode_reply(
            Reply(request_id, Status.OK, "", wire.pack(self.stats())))))  # plain msgpack: no arrays to encode

    def _client_protocol_error(self, client: bytes, frames: list[bytes], exc: ProtocolError) -> None:
        self.logs.log("bad-client-frame", logging.WARNING, "malformed message from a client: %s", exc)
        request_id = wire.request_id_of(frames)
        if request_id is not None and (client, request_id) not in self.by_client:
            self._send_client(client, Reply(request_id, Status.BAD_REQUEST, f"malformed message: {exc}"))

    def _expiry_s(self) -> float:
        return self.config.heartbeat_ms * self.config.heartbeat_liveness / 1000

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "uptime_s": round(now - self.started_at, 3),
            "draining": self.draining,
            "limits": stats.limits_stats(self._default_limits, self.config.max_message_bytes),
            "worker_removals": dict(self.removals),
            "models": {name: stats.model_stats(model, now) for name, model in self.models.items()},
            "workers": [stats.worker_stats(worker, now) for worker in self.workers.values()],
        }
