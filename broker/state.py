"""The broker's bookkeeping records: jobs, workers and per-model backlogs.

Plain data with a few invariants kept by small methods; the decisions that
use them live in :mod:`broker.core` and :mod:`broker.admission`.

A job's phase is one value, and its legal moves are data (``TRANSITIONS``,
after h11's ``_state.py``): each step a job can take, from each phase, to the
phase it lands in.  A step the table does not list raises
:class:`IllegalTransition`, so a slip in the core (an answer sent twice, an
answered job dispatched) fails loudly where it happens instead of skewing the
counts that admission and dispatch decide by::

    ADMITTED --enqueue--> WAITING --dispatch--> DISPATCHED --release--> RETURNED
                          |    ^                     |                     |
                          |    +------------ enqueue (a retry) ------------+
                        settle                     settle                  |
                          v                          v                     |
                         DONE <-----release------ ANSWERED                 |
                          ^---------------------- settle ------------------+

``settle`` is the client's one answer (or its cancel); ``release`` is the
worker letting go (its reply, a decline, its death).  A job answered on a
worker stays ANSWERED, keeping that worker's credit, until the worker lets go.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from dataclasses import astuple, dataclass, field

from broker.rates import Lateness, ServiceRate
from zbatch.protocol.wire import HIGH_PRIORITY, LOW_PRIORITY, NORMAL_PRIORITY, BatchCounters, Ready, Status
from zbatch.runtime.histogram import SECONDS_BUCKETS, Histogram

PRIORITIES = range(HIGH_PRIORITY, LOW_PRIORITY + 1)
MAX_TOTAL = 2**62  # counters saturate here, so sums over many workers still fit a msgpack integer


class Phase(enum.IntEnum):
    """Where a job is, and whether its client still waits for the answer.  (Integers: they hash in C, and the
    core looks phases up on every step of every request.)"""

    ADMITTED = 1  # just admitted, not yet in its backlog
    WAITING = 2  # in its model's backlog at the broker
    DISPATCHED = 3  # on a worker; the client waits for its answer
    RETURNED = 4  # its worker let go of it unanswered: it is answered or waits again, in the same event
    ANSWERED = 5  # the client has its answer (or cancelled); a worker still holds it, and its credit
    DONE = 6  # answered, and no worker holds it: the broker forgets it


class Step(enum.IntEnum):
    """What can happen to a job."""

    ENQUEUE = 1  # into its model's backlog: on admission, or back from a worker for a retry
    DISPATCH = 2  # to a worker
    SETTLE = 3  # its client is answered, or cancelled it
    RELEASE = 4  # its worker lets go of it: it replied or declined, or died


# Every legal move: from a phase, a step, and the phase it lands in.  Anything else is a bug in the core.
TRANSITIONS: dict[Phase, dict[Step, Phase]] = {
    Phase.ADMITTED: {Step.ENQUEUE: Phase.WAITING},
    Phase.WAITING: {Step.DISPATCH: Phase.DISPATCHED, Step.SETTLE: Phase.DONE},
    Phase.DISPATCHED: {Step.RELEASE: Phase.RETURNED, Step.SETTLE: Phase.ANSWERED},
    Phase.RETURNED: {Step.ENQUEUE: Phase.WAITING, Step.SETTLE: Phase.DONE},
    Phase.ANSWERED: {Step.RELEASE: Phase.DONE},
    Phase.DONE: {},
}
OWED = frozenset({Phase.ADMITTED, Phase.WAITING, Phase.DISPATCHED, Phase.RETURNED})  # the client waits


class IllegalTransition(Exception):
    """A job was asked to take a step its phase does not allow: a bug in the broker, never the peers' doing."""


@dataclass(slots=True, eq=False)
class Job:
    """One admitted client request, from admission until its worker has let go of it.

    ``phase`` is where it is (:class:`Phase`), changed only by :meth:`advance`.
    ``worker`` is the worker holding it, while one does (DISPATCHED or
    ANSWERED).  ``deaths`` counts the workers that died while running it;
    ``isolated`` says it runs alone on its worker (it is a retry, and may be
    what killed the last one).  ``strays`` counts the workers that answered it
    with a status a worker may not send (PROTOCOL.md 6.3), the last of which,
    ``avoid``, it is not sent back to while another worker serves its model.
    """

    job_id: bytes
    client: bytes
    request_id: bytes
    model: str
    items: int
    payload: bytes
    admitted_at: float
    deadline: float
    priority: int = NORMAL_PRIORITY
    trace: str = ""
    grouped: bool = False  # its client takes the answer in a REPLIES message
    deaths: int = 0
    strays: int = 0
    avoid: bytes | None = None
    expected: float = 0.0  # when admission predicted its answer (0: no rate to predict with)
    isolated: bool = False
    worker: WorkerState | None = None
    phase: Phase = Phase.ADMITTED

    @property
    def owed(self) -> bool:
        """Its client still waits for its one answer."""
        return self.phase in OWED

    def advance(self, step: Step) -> Phase:
        """Take ``step`` (:data:`TRANSITIONS`), or raise :class:`IllegalTransition` if its phase forbids it."""
        moves = TRANSITIONS[self.phase]
        phase = moves.get(step)
        if phase is None:
            allowed = ", ".join(move.name.lower() for move in moves) or "nothing"
            raise IllegalTransition(f"job {self.job_id.hex()} cannot {step.name.lower()}: it is "
                                    f"{self.phase.name.lower()}, which allows {allowed}")
        self.phase = phase
        return phase


@dataclass(slots=True, eq=False)
class WorkerState:
    """A registered worker.  ``capacity`` is what this broker may have in flight on it: READY's, until a
    worker of several brokers announces its share in a heartbeat (PROTOCOL.md 6.6)."""

    identity: bytes
    ready: Ready
    last_seen: float
    capacity: int = -1  # -1: READY's
    last_dispatch: float = float("-inf")
    in_flight: dict[bytes, Job] = field(default_factory=dict)
    in_flight_items: int = 0
    isolated_in_flight: int = 0  # retried jobs in flight, each of which gets the worker to itself
    batches: dict[str, BatchCounters] = field(default_factory=dict)
    rates: dict[str, ServiceRate] = field(default_factory=dict)  # by model
    shared: bool = False  # it has announced a share: it serves several brokers
    draining: bool = False
    declined: int = 0  # requests the worker declined (full with other brokers' work)

    def __post_init__(self) -> None:
        if self.capacity < 0:
            self.capacity = self.ready.capacity

    @property
    def models(self) -> list[str]:
        return [m.name for m in self.ready.models]

    @property
    def ready_models(self) -> frozenset[str]:
        return frozenset(m.name for m in self.ready.models)

    @property
    def free_credit(self) -> int:
        return self.capacity - self.in_flight_items

    @property
    def label(self) -> str:
        """The worker as a person reads it in an answer: its name (else its routing id), pid and host."""
        ident = self.identity
        name = self.ready.name or (ident.decode() if ident.isascii() and ident.decode().isprintable() else ident.hex())
        where = " on ".join(part for part in (f"pid {self.ready.pid}" if self.ready.pid else "", self.ready.host)
                            if part)
        return f"{name} ({where})" if where else name

    @property
    def takes_work(self) -> bool:
        """Not draining, and a share above 0: new work may come to it."""
        return not self.draining and self.capacity > 0

    def rate(self, model: str) -> float | None:
        """Items per second of ``model`` this worker runs for this broker, once established
        (:mod:`broker.rates`); None: no such measurement yet, or it takes no work now."""
        measured = self.rates.get(model)
        if measured is None or not measured.established or not self.takes_work:
            return None
        return measured.per_second(self.shared)

    def has_credit_for(self, items: int) -> bool:
        """Room for a new request of ``items``: a request larger than the whole capacity goes only to an
        idle worker, and nothing joins a retried request running alone."""
        if not self.takes_work or self.isolated_in_flight:
            return False
        if items > self.capacity:
            return self.in_flight_items == 0
        return items <= self.free_credit

    def can_take(self, job: Job) -> bool:
        """:meth:`has_credit_for` the job's items; a job that may have killed a worker goes only to an idle
        one.  A worker whose share for this broker is 0 takes nothing."""
        if job.deaths:
            return self.takes_work and not self.isolated_in_flight and self.in_flight_items == 0
        return self.has_credit_for(job.items)

    def take(self, job: Job, now: float) -> None:
        """Dispatch ``job`` to this worker: it holds the job, and the job's items of its credit."""
        job.advance(Step.DISPATCH)
        job.isolated = job.deaths > 0
        self.in_flight[job.job_id] = job
        self.in_flight_items += job.items
        self.isolated_in_flight += job.isolated
        self.last_dispatch = now
        job.worker = self

    def release(self, job_id: bytes) -> Job | None:
        """The worker lets go of a job it holds (None: it holds no such job): RETURNED if its client still
        waits, else DONE."""
        job = self.in_flight.get(job_id)
        if job is not None:
            job.advance(Step.RELEASE)
            del self.in_flight[job_id]
            self.in_flight_items -= job.items
            self.isolated_in_flight -= job.isolated
            job.worker = None
        return job


@dataclass(slots=True, eq=False)
class ModelState:
    """A model's backlog: one FIFO per priority class, highest first.

    ``known`` once configured or announced by a worker; ``workerless_since``
    is when its last worker left (the core forgets idle models after a
    while).  ``dispatched`` and ``queue_time`` (admission to dispatch,
    seconds) feed the broker's metrics.  ``waiting`` counts the items
    waiting in each priority class, ``in_flight_items`` those on workers
    (answered or not, until the worker lets go), and ``rate`` is the sum of
    its workers' established rates (:meth:`measure_rate`; None while none is
    established): what admission predicts waits from, with ``lateness``, how much later than
    predicted its answers have come.
    """

    name: str
    known: bool = False
    backlogs: tuple[deque[Job], ...] = field(default_factory=lambda: tuple(deque() for _ in PRIORITIES))
    backlog_items: int = 0
    waiting: list[int] = field(default_factory=lambda: [0 for _ in PRIORITIES])
    in_flight_items: int = 0
    backlogged_since: float | None = None  # since when items have waited without a break (None: none wait)
    rate: float | None = None
    lateness: Lateness = field(default_factory=Lateness)
    backlog_bytes: int = 0
    held_bytes: int = 0  # payloads the broker holds for this model: waiting, and on workers until answered
    workers: dict[bytes, WorkerState] = field(default_factory=dict)
    workerless_since: float | None = None
    answered: Counter[Status] = field(default_factory=Counter)
    retired_batches: BatchCounters = field(default_factory=BatchCounters)
    dispatched: int = 0
    queue_time: Histogram = field(default_factory=lambda: Histogram(SECONDS_BUCKETS))

    def enqueue(self, job: Job, *, front: bool = False) -> None:
        """Into its priority's backlog: at the back when admitted, at the front when back from a worker."""
        job.advance(Step.ENQUEUE)
        if front:
            self.backlogs[job.priority].appendleft(job)
        else:
            self.backlogs[job.priority].append(job)
        self.backlog_items += job.items
        self.waiting[job.priority] += job.items
        self.backlog_bytes += len(job.payload)

    def first_waiting(self) -> Job | None:
        """The next job to dispatch: the head of the highest non-empty class.

        Jobs answered while they waited are skipped (and dropped) here.
        """
        for backlog in self.backlogs:
            while backlog and backlog[0].phase is not Phase.WAITING:
                backlog.popleft()
            if backlog:
                return backlog[0]
        return None

    def waiting_jobs(self) -> list[Job]:
        return [job for backlog in self.backlogs for job in backlog if job.phase is Phase.WAITING]

    def dequeue(self, job: Job) -> Job:
        """Take the job returned by :meth:`first_waiting` off its queue, to dispatch it."""
        self.backlogs[job.priority].popleft()
        self.forget_waiting(job)
        return job

    def forget_waiting(self, job: Job) -> None:
        """Stop counting a job that waited: it is being dispatched, or was answered (it then leaves its
        deque lazily, in :meth:`first_waiting`)."""
        self.backlog_items -= job.items
        self.waiting[job.priority] -= job.items
        self.backlog_bytes -= len(job.payload)

    def ahead_of(self, priority: int) -> int:
        """Items that run before a request of ``priority`` admitted now: those on workers, and those waiting
        at its priority or higher."""
        return self.in_flight_items + sum(self.waiting[: priority + 1])

    def predicted_wait_s(self, priority: int, items: int, now: float) -> float | None:
        """How long a request of ``items`` at ``priority`` admitted now would wait for its answer; None
        without a rate."""
        if self.rate is None:
            return None
        return (self.ahead_of(priority) + items) / self.rate + self.lateness.now(now)

    def answered_at(self, job: Job, now: float) -> None:
        """A job's answer came (or its deadline did, on a worker): how late was it against its prediction?"""
        if job.expected:
            self.lateness.observe(now - job.expected, now)

    def note_backlog(self, now: float) -> None:
        """Keep ``backlogged_since``: call after the backlog may have changed (dispatch, an answer)."""
        if not self.backlog_items:
            self.backlogged_since = None
        elif self.backlogged_since is None:
            self.backlogged_since = now

    def room_for(self, items: int, priority: int) -> bool:
        """Whether a request admitted now would be dispatched at once: nothing of its priority or higher waits,
        and a worker has credit for it.  Admission never refuses such a request (PROTOCOL.md 6.1)."""
        if any(self.waiting[: priority + 1]):
            return False
        return any(worker.has_credit_for(items) for worker in self.workers.values())

    def measure_rate(self) -> None:
        """The sum of the established rates of the workers that take work; one that has no established rate
        of its own yet (just registered, or restarted) counts at their mean, not at nothing.  None while no
        worker's rate is established."""
        rates: list[float] = []
        unmeasured = 0
        for worker in self.workers.values():
            if worker.takes_work:
                rate = worker.rate(self.name)
                if rate is None:
                    unmeasured += 1
                else:
                    rates.append(rate)
        self.rate = sum(rates) * (1 + unmeasured / len(rates)) if rates else None

    def batch_totals(self) -> BatchCounters:
        totals = self.retired_batches
        for worker in self.workers.values():
            totals = add_counters(totals, worker.batches.get(self.name))
        return totals

    def retire(self, worker: WorkerState, now: float) -> None:
        """Keep a departing worker's batch counts in the model's totals."""
        self.workers.pop(worker.identity, None)
        self.retired_batches = add_counters(self.retired_batches, worker.batches.get(self.name))
        self.measure_rate()
        if not self.workers:
            self.workerless_since = now

    def idle(self) -> bool:
        """Nothing waits for this model and no worker serves it."""
        return not self.workers and self.backlog_items == 0 and self.first_waiting() is None


def add_counters(total: BatchCounters, more: BatchCounters | None) -> BatchCounters:
    """The sum of two counter sets, each count saturating at :data:`MAX_TOTAL`."""
    if more is None:
        return total
    return BatchCounters(*(min(MAX_TOTAL, a + b) for a, b in zip(astuple(total), astuple(more), strict=True)))
