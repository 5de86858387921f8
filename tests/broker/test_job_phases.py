"""A broker job's phase: one value, moved only along ``broker.state.TRANSITIONS``.

The legal paths hold on the real records (``ModelState``, ``WorkerState``) and through the real core on a fake
clock; every step the table does not list raises ``IllegalTransition`` naming the job, the step and the phase,
and leaves the job, its backlog and its worker as they were.
"""

from __future__ import annotations

import pytest

from broker.core import BrokerCore
from broker.state import OWED, TRANSITIONS, IllegalTransition, Job, ModelState, Phase, Step, WorkerState
from tests.broker.test_core import MODEL, FakeClock, client_replies, dispatched, make_core, ready, send, take
from zbatch.protocol import wire
from zbatch.protocol.wire import ModelInfo, Ready, Reply, Status

ILLEGAL = [(phase, step) for phase in Phase for step in Step if step not in TRANSITIONS[phase]]
ILLEGAL_IDS = [f"{step.name.lower()}-when-{phase.name.lower()}" for phase, step in ILLEGAL]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def job(items: int = 1) -> Job:
    return Job(b"\x00\x01", b"C", b"r1", MODEL, items, b"payload", admitted_at=0.0, deadline=1.0)


def worker(capacity: int = 4) -> WorkerState:
    return WorkerState(b"W1", Ready((ModelInfo(MODEL, "embeddings", 2),), capacity), last_seen=0.0)


def in_phase(phase: Phase) -> Job:
    """A job brought to ``phase`` by legal steps only."""
    paths = {
        Phase.ADMITTED: (),
        Phase.WAITING: (Step.ENQUEUE,),
        Phase.DISPATCHED: (Step.ENQUEUE, Step.DISPATCH),
        Phase.RETURNED: (Step.ENQUEUE, Step.DISPATCH, Step.RELEASE),
        Phase.ANSWERED: (Step.ENQUEUE, Step.DISPATCH, Step.SETTLE),
        Phase.DONE: (Step.ENQUEUE, Step.SETTLE),
    }
    record = job()
    for step in paths[phase]:
        record.advance(step)
    assert record.phase is phase
    return record


def test_the_table_covers_every_phase_and_only_done_is_final() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert [phase for phase, moves in TRANSITIONS.items() if not moves] == [Phase.DONE]
    assert OWED == {Phase.ADMITTED, Phase.WAITING, Phase.DISPATCHED, Phase.RETURNED}


@pytest.mark.parametrize(("phase", "step"), ILLEGAL, ids=ILLEGAL_IDS)
def test_every_step_the_table_does_not_list_raises_and_changes_nothing(phase: Phase, step: Step) -> None:
    record = in_phase(phase)
    said = f"job 0001 cannot {step.name.lower()}: it is {phase.name.lower()}, which allows"
    with pytest.raises(IllegalTransition, match=said):
        record.advance(step)
    assert record.phase is phase


def test_answering_twice_raises() -> None:
    record = in_phase(Phase.WAITING)
    record.advance(Step.SETTLE)
    with pytest.raises(IllegalTransition, match="cannot settle: it is done, which allows nothing"):
        record.advance(Step.SETTLE)
    on_worker = in_phase(Phase.ANSWERED)
    with pytest.raises(IllegalTransition, match="cannot settle: it is answered, which allows release"):
        on_worker.advance(Step.SETTLE)


def test_dispatching_an_answered_job_raises_and_the_worker_keeps_its_credit() -> None:
    model, held = ModelState(MODEL), worker()
    record = job(items=2)
    model.enqueue(record)
    record.advance(Step.SETTLE)  # answered while it waited: it leaves the backlog lazily
    with pytest.raises(IllegalTransition, match="cannot dispatch: it is done"):
        held.take(record, now=1.0)
    assert held.in_flight == {} and held.free_credit == 4 and record.worker is None
    assert model.first_waiting() is None


def test_a_dispatched_job_cannot_wait_again_until_its_worker_lets_go() -> None:
    model, held = ModelState(MODEL), worker()
    record = job(items=2)
    model.enqueue(record)
    held.take(model.dequeue(record), now=1.0)
    with pytest.raises(IllegalTransition, match="cannot enqueue: it is dispatched, which allows release, settle"):
        model.enqueue(record, front=True)
    assert model.backlog_items == 0 and model.first_waiting() is None
    assert held.release(record.job_id) is record and record.phase is Phase.RETURNED and record.worker is None
    model.enqueue(record, front=True)
    assert model.first_waiting() is record and model.backlog_items == 2


def test_the_legal_path_through_the_records_keeps_the_counts() -> None:
    model, held = ModelState(MODEL), worker()
    record = job(items=3)
    model.enqueue(record)
    assert (record.phase, model.backlog_items, record.owed) == (Phase.WAITING, 3, True)
    held.take(model.dequeue(record), now=1.0)
    assert (record.phase, record.worker, held.free_credit, model.backlog_items) == (Phase.DISPATCHED, held, 1, 0)
    record.advance(Step.SETTLE)  # a deadline or a cancel: the worker's credit stays taken
    assert (record.phase, record.worker, held.free_credit, record.owed) == (Phase.ANSWERED, held, 1, False)
    assert held.release(record.job_id) is record
    assert (record.phase, record.worker, held.free_credit) == (Phase.DONE, None, 4)
    assert held.release(record.job_id) is None  # a second reply for it finds nothing to let go


def the_job(core: BrokerCore) -> Job:
    [only] = core.jobs.values()
    return only


def phase(record: Job) -> Phase:
    """Read afresh after each event (an assert on ``record.phase`` would narrow its type for the rest)."""
    return record.phase


def test_through_the_core_a_cancelled_running_request_is_answered_until_its_worker_replies(
        clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r1", items=2)
    [(_, request)] = dispatched(take(core))
    record = the_job(core)
    assert phase(record) is Phase.DISPATCHED and record.worker is core.workers[b"W1"]
    core.client_message(b"C", wire.encode_cancel(b"r1"))
    core.client_message(b"C", wire.encode_cancel(b"r1"))  # a second cancel changes nothing
    assert phase(record) is Phase.ANSWERED and core.workers[b"W1"].free_credit == 2 and not core.by_client
    take(core)
    core.worker_message(b"W1", wire.encode_reply(Reply(request.request_id, Status.OK, "", b"late")))
    assert phase(record) is Phase.DONE and not core.jobs and not client_replies(take(core))
    assert core.workers[b"W1"].free_credit == 4 and core.idle


def test_through_the_core_a_dead_workers_job_waits_again_then_runs_elsewhere(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r1")
    take(core)
    record = the_job(core)
    core.worker_message(b"W1", wire.encode_disconnect("killed"))
    assert phase(record) is Phase.WAITING and record.worker is None and record.deaths == 1
    ready(core, b"W2")
    [(identity, request)] = dispatched(take(core))
    assert identity == b"W2" and phase(record) is Phase.DISPATCHED
    core.worker_message(b"W2", wire.encode_reply(Reply(request.request_id, Status.OK, "", b"result")))
    [reply] = client_replies(take(core))
    assert reply.status is Status.OK and phase(record) is Phase.DONE and not core.jobs


def test_through_the_core_a_request_answered_while_it_waits_is_done(clock: FakeClock) -> None:
    core = make_core(clock)
    send(core, b"r1")
    record = the_job(core)
    assert phase(record) is Phase.WAITING
    clock.advance(0.6)  # past the no-worker grace, before the deadline
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.NO_WORKER and phase(record) is Phase.DONE and not core.jobs
