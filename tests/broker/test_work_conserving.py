"""The broker's work-conserving invariant (PROTOCOL.md 6.1), as a property of the real core on a fake clock.

    No request is refused while a worker of its model has free credit for it and nothing of its
    priority or higher waits at the broker.

Hypothesis drives the core through random sequences of what happens to a broker: workers register
(again), announce shares, drain, disconnect, fall silent and expire; heartbeats report work that makes
their rates anything from a slow first batch to thousands of items a second; replies come back; clients
send requests of random sizes, priorities and deadlines, and cancel them; the clock moves on.  After
every event the test checks, with its own reading of the state (not the core's helpers):

* every request the core answered ``overloaded`` found, when it came, no worker of its model with credit
  for it, or items of its priority or higher waiting;
* nothing waits that a worker could take: the head of each model's backlog fits no worker's free credit;
* every job the core holds is in a phase its facts agree with (``broker.state.Phase``): waiting in its
  model's backlog, or held by its worker, whether answered or not; and no step it took was illegal
  (an illegal one raises).

Outside the invariant, and kept out of these sequences: a draining broker, a connection at its cap of
unanswered requests, and payload bytes at their bound (PROTOCOL.md 6.1 says why).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.config import BrokerConfig
from broker.core import BrokerCore, Peer
from broker.state import ModelState, Phase, WorkerState
from tests.broker.test_core import FakeClock
from zbatch.protocol import wire
from zbatch.protocol.wire import (
    HIGH_PRIORITY,
    LOW_PRIORITY,
    BatchCounters,
    Heartbeat,
    ModelInfo,
    Ready,
    Reply,
    Request,
    Status,
)

MODELS = ("m", "n")
WORKERS = tuple(b"W%d" % i for i in range(5))
CLIENTS = tuple(b"C%d" % i for i in range(3))
HEARTBEAT_S = 1.0


def free_for(worker: WorkerState, items: int) -> bool:
    """The test's own reading of 'free credit for a request of ``items``' (3.4, 6.2, 6.3)."""
    if worker.draining or worker.capacity <= 0 or worker.isolated_in_flight:
        return False
    if items > worker.capacity:
        return worker.in_flight_items == 0
    return worker.capacity - worker.in_flight_items >= items


def room(model: ModelState | None, items: int, priority: int) -> bool:
    if model is None:
        return False
    ahead = sum(job.items for job in model.waiting_jobs() if job.priority <= priority)
    return ahead == 0 and any(free_for(worker, items) for worker in model.workers.values())


class Broker(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        config = BrokerConfig(models=MODELS, timeout_ms=2_000, max_timeout_ms=10_000, cold_backlog=16,
                              max_backlog=200, max_client_requests=100_000, no_worker_grace_ms=500,
                              heartbeat_ms=round(HEARTBEAT_S * 1000), max_retries=1)
        self.core = BrokerCore(config.core_settings(), self.clock)
        self.counters: dict[tuple[bytes, str], BatchCounters] = {}
        self.requests = 0
        self.sent: list[tuple[bytes, bytes]] = []

    # ------------------------------------------------------------------ what happens

    @rule(worker=st.sampled_from(WORKERS), capacity=st.integers(1, 12), both=st.booleans())
    def register(self, worker: bytes, capacity: int, both: bool) -> None:
        models = MODELS if both else MODELS[:1]
        infos = tuple(ModelInfo(name, "embeddings", 4) for name in models)
        self.core.worker_message(worker, wire.encode_ready(Ready(infos, capacity, pid=int(worker[1:]) + 1)))
        for name in models:
            self.counters[(worker, name)] = BatchCounters()

    @rule(worker=st.sampled_from(WORKERS), batches=st.integers(0, 12), items=st.integers(0, 60),
          busy_ms=st.integers(0, 3_000), share=st.none() | st.integers(0, 12))
    def heartbeat(self, worker: bytes, batches: int, items: int, busy_ms: int, share: int | None) -> None:
        """Work the worker reports: any rate, from a slow first batch to a fast device; a share sometimes."""
        reports = {}
        for (identity, name), old in self.counters.items():
            if identity == worker:
                reports[name] = BatchCounters(old.batches + batches, old.items + items, busy_ms=old.busy_ms + busy_ms)
                self.counters[(identity, name)] = reports[name]
        self.core.worker_message(worker, wire.encode_heartbeat(Heartbeat(reports, share)))

    @rule(worker=st.sampled_from(WORKERS), status=st.sampled_from([Status.OK, Status.OK, Status.DECLINED]))
    def reply(self, worker: bytes, status: Status) -> None:
        state = self.core.workers.get(worker)
        if state is not None and state.in_flight:
            job_id = next(iter(state.in_flight))
            self.core.worker_message(worker, wire.encode_reply(Reply(job_id, status, "", b"r")))

    @rule(worker=st.sampled_from(WORKERS))
    def drain(self, worker: bytes) -> None:
        self.core.worker_message(worker, wire.encode_drain())

    @rule(worker=st.sampled_from(WORKERS), clean=st.booleans())
    def leave(self, worker: bytes, clean: bool) -> None:
        self.core.worker_message(worker, wire.encode_disconnect("killed" if not clean else "stopping"))

    @rule(seconds=st.sampled_from([0.001, 0.05, 0.3, 1.0, 3.5]))
    def time_passes(self, seconds: float) -> None:
        """Deadlines, the no-worker grace, and silent workers expiring (after 3 s without a message)."""
        self.clock.advance(seconds)
        self.core.tick()

    @rule(client=st.sampled_from(CLIENTS), model=st.sampled_from(MODELS), items=st.integers(1, 14),
          priority=st.integers(HIGH_PRIORITY, LOW_PRIORITY), timeout_ms=st.sampled_from([None, 100, 900, 5_000]))
    def request(self, client: bytes, model: str, items: int, priority: int, timeout_ms: int | None) -> None:
        had_room = room(self.core.models.get(model), items, priority)
        self.requests += 1
        request_id = b"r%d" % self.requests
        self.sent.append((client, request_id))
        self.core.client_message(client, wire.encode_request(Request(request_id, model, items, b"p", timeout_ms,
                                                                     priority)))
        refused = [reply for reply in self.replies() if reply.request_id == request_id]
        if had_room:
            assert not refused, f"refused with a worker free and nothing ahead: {refused}"

    @rule(index=st.integers(0, 1_000))
    def cancel(self, index: int) -> None:
        if self.sent:
            client, request_id = self.sent[index % len(self.sent)]
            self.core.client_message(client, wire.encode_cancel(request_id))

    # ------------------------------------------------------------------ what must hold

    def replies(self) -> list[Reply]:
        out, self.core.outbox = self.core.outbox, []
        return [wire.decode_reply(frames) for peer, _, frames in out
                if peer is Peer.CLIENT and frames[0] == wire.HEADERS[wire.Command.REPLY]]

    @invariant()
    def nothing_waits_that_a_worker_could_take(self) -> None:
        self.replies()
        for model in self.core.models.values():
            head = model.first_waiting()
            if head is None:
                continue
            takers = [w for w in model.workers.values()
                      if w.identity != head.avoid and free_for(w, head.items)
                      and (not head.deaths or w.in_flight_items == 0)]
            assert not takers, f"{head.items} items wait for {model.name} while {takers[0].label} has credit"

    @invariant()
    def each_job_is_where_its_phase_says(self) -> None:
        for job in self.core.jobs.values():
            if job.phase is Phase.WAITING:
                assert job.worker is None and job in self.core.models[job.model].waiting_jobs(), job
            else:
                assert job.phase in (Phase.DISPATCHED, Phase.ANSWERED), job
                assert job.worker is not None and job.worker.in_flight.get(job.job_id) is job, job
            assert job.owed == (self.core.by_client.get((job.client, job.request_id)) is job), job


Broker.TestCase.settings = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                                    stateful_step_count=60, suppress_health_check=[HealthCheck.too_slow])
TestWorkConservingBroker = Broker.TestCase


def test_a_request_that_leaves_the_head_of_the_backlog_lets_the_next_one_go() -> None:
    """Found by the machine above: the head of the backlog, too large for the free credit, expired; the one
    behind it fitted and waited until something else happened at the broker (a reply, a registration)."""
    clock = FakeClock()
    core = BrokerCore(BrokerConfig(models=("m",), timeout_ms=1_000).core_settings(), clock)
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo("m", "embeddings", 2),), 2)))
    for request_id, items, timeout_ms in ((b"a", 1, None), (b"head", 2, 100), (b"next", 1, None)):
        core.client_message(b"C", wire.encode_request(Request(request_id, "m", items, b"p", timeout_ms)))
    clock.advance(0.3)
    core.outbox.clear()
    core.tick()
    sent = [wire.decode_broker_to_worker(frames) for peer, _, frames in core.outbox if peer is Peer.WORKER]
    assert [(m.items, m.timeout_ms) for m in sent if isinstance(m, Request)] == [(1, 700)]
