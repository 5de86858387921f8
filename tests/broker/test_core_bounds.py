"""The broker core under hostile peers: every bound holds, every request still gets exactly one answer.

Driven like tests/broker/test_core.py, with fake frames and a fake clock; the
real daemons face the same peers in tests/broker/test_hostile_peers.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from broker.core import FORGET_MODEL_S, MAX_WORKERLESS_MODELS, OVERDUE_S, SWEEP_EVERY_S, BrokerCore
from broker.state import MAX_TOTAL, add_counters
from tests.broker.test_core import (
    MODEL,
    FakeClock,
    client_replies,
    dispatched,
    make_core,
    ready,
    send,
    take,
    worker_reply,
)
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import (
    HIGH_PRIORITY,
    LOW_PRIORITY,
    BatchCounters,
    Heartbeat,
    ModelInfo,
    Ready,
    Request,
    Status,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def send_payload(core: BrokerCore, request_id: bytes, payload: bytes, client: bytes = b"C", **kw: Any) -> None:
    core.client_message(client, wire.encode_request(Request(request_id, MODEL, 1, payload, **kw)))


def test_the_size_check_uses_the_limit_of_the_requests_priority(clock: FakeClock) -> None:
    """High may carry up to its larger limit; low past its limit can never fit: bad_request, not "retry"."""
    core = make_core(clock, max_backlog=256, no_worker_grace_ms=10_000)
    send(core, b"high", items=300, priority=HIGH_PRIORITY)
    send(core, b"low", items=200, priority=LOW_PRIORITY)
    [reply] = client_replies(take(core))
    assert reply.request_id == b"low" and reply.status is Status.BAD_REQUEST
    assert "at most 192 items" in reply.message and "split it" in reply.message
    assert core.stats()["models"][MODEL]["backlog_items"] == 300


def test_backlogs_are_bounded_in_bytes_too(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog_bytes=10_000, no_worker_grace_ms=10_000)
    send_payload(core, b"a", b"x" * 6_000)
    send_payload(core, b"b", b"x" * 6_000)  # fits alone, not next to a
    send_payload(core, b"huge", b"x" * 20_000)  # never fits
    full, huge = client_replies(take(core))
    assert (full.request_id, full.status, full.retry_after_ms) == (b"b", Status.OVERLOADED, 1000)
    assert "holds 6000 payload bytes" in full.message
    assert (huge.request_id, huge.status) == (b"huge", Status.BAD_REQUEST) and "payload bytes" in huge.message
    assert core.stats()["models"][MODEL]["backlog_bytes"] == 6_000


def test_payloads_on_a_worker_count_until_answered(clock: FakeClock) -> None:
    """A worker that takes big payloads and never answers cannot make the broker hold more than the limit."""
    core = make_core(clock, max_backlog_bytes=10_000, heartbeat_ms=1_000_000)
    ready(core, b"liar", capacity=100)
    send_payload(core, b"a", b"x" * 6_000)
    send_payload(core, b"b", b"x" * 6_000)
    out = take(core)
    assert len(dispatched(out)) == 1
    [refused] = client_replies(out)
    assert (refused.request_id, refused.status) == (b"b", Status.OVERLOADED)
    clock.advance(1.5)  # a's deadline: answered, its payload let go although the liar still holds the job
    core.tick()
    send_payload(core, b"c", b"x" * 6_000)
    assert len(dispatched(take(core))) == 1
    assert core.stats()["models"][MODEL]["held_bytes"] == 6_000


def test_one_connection_holds_a_bounded_number_of_unanswered_requests(clock: FakeClock) -> None:
    core = make_core(clock, max_client_requests=2, no_worker_grace_ms=10_000)
    for request_id in (b"1", b"2", b"3"):
        send(core, request_id, client=b"greedy")
    send(core, b"1", client=b"other")
    [reply] = client_replies(take(core))
    assert (reply.request_id, reply.status) == (b"3", Status.OVERLOADED) and "2 requests unanswered" in reply.message
    ready(core, b"W1", capacity=8)
    for worker_id, job in dispatched(take(core)):
        worker_reply(core, worker_id, job.request_id)
    assert len(client_replies(take(core))) == 3
    send(core, b"4", client=b"greedy")  # its answers came back: room again
    assert dispatched(take(core))
    assert core.unanswered[b"greedy"] == 1


def test_a_worker_that_never_answers_loses_the_payloads_at_their_deadlines_and_is_removed_later(
        clock: FakeClock) -> None:
    core = make_core(clock, heartbeat_ms=1_000_000)  # it heartbeats; it just never answers
    ready(core, b"liar", capacity=4)
    send_payload(core, b"r", b"x" * 5_000)
    assert len(dispatched(take(core))) == 1
    clock.advance(1.5)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.DEADLINE_EXCEEDED
    assert all(held.payload == b"" for held in core.jobs.values())
    assert core.workers[b"liar"].in_flight_items == 1  # its credit stays taken until it answers
    clock.advance(OVERDUE_S + SWEEP_EVERY_S)
    core.tick()
    assert b"liar" not in core.workers and core.removals["overdue"] == 1 and not core.jobs


def test_a_cancelled_reply_nobody_asked_for_sends_the_work_to_another_worker(clock: FakeClock) -> None:
    """The work was not done, and the worker, not the input, is at fault: another worker gets it."""
    core = make_core(clock)
    ready(core, b"W1", capacity=1)
    send(core, b"r")
    [(_, job)] = dispatched(take(core))
    ready(core, b"W2", capacity=1)
    worker_reply(core, b"W1", job.request_id, Status.CANCELLED)
    out = take(core)
    assert client_replies(out) == []
    [(again, retry)] = dispatched(out)
    assert again == b"W2" and retry.request_id == job.request_id
    worker_reply(core, b"W2", retry.request_id)
    [reply] = client_replies(take(core))
    assert reply.status is Status.OK


def test_a_stray_status_with_no_other_worker_is_worker_lost_naming_the_worker(clock: FakeClock) -> None:
    core = make_core(clock)
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 2),), 4, "gpu-7", "h1", 42)))
    send(core, b"r")
    [(_, job)] = dispatched(take(core))
    worker_reply(core, b"W1", job.request_id, Status.CANCELLED)
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_LOST
    assert "worker gpu-7 (pid 42 on h1) answered 'cancelled'" in reply.message
    assert "no other worker serves the model" in reply.message
    assert b"W1" in core.workers and not core.jobs  # the worker stays; the job is gone


@pytest.mark.parametrize("status", [Status.OVERLOADED, Status.UNKNOWN_MODEL, Status.NO_WORKER, Status.WORKER_LOST])
def test_a_status_only_the_broker_gives_is_a_stray_too_and_spends_the_retry_budget(clock: FakeClock,
                                                                                  status: Status) -> None:
    core = make_core(clock, max_retries=1)
    ready(core, b"W1", capacity=1)
    ready(core, b"W2", capacity=1)
    send(core, b"r")
    [(first, job)] = dispatched(take(core))
    worker_reply(core, first, job.request_id, status)
    [(second, retry)] = dispatched(take(core))
    assert second != first
    worker_reply(core, second, retry.request_id, status)
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_LOST and "the retry budget is spent" in reply.message
    assert f"answered {status.value!r}, a status only the broker gives" in reply.message


def test_a_retry_after_a_stray_avoids_the_worker_that_failed_it_while_another_is_busy(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=2)
    ready(core, b"W1", capacity=1)
    ready(core, b"W2", capacity=1)
    send(core, b"busy")
    send(core, b"r")
    jobs = {job.request_id: (worker, job) for worker, job in dispatched(take(core))}
    (w_busy, _), (w_liar, job) = jobs.values()
    worker_reply(core, w_liar, job.request_id, Status.CANCELLED)
    assert dispatched(take(core)) == []  # it waits for the other worker, though the liar has room
    [(busy_worker, busy_job)] = [(w, j) for w, j in jobs.values() if w == w_busy]
    worker_reply(core, busy_worker, busy_job.request_id)
    [(again, _)] = dispatched(take(core))
    assert again == w_busy


def test_a_retry_on_a_worker_that_goes_silent_is_worker_lost_with_the_default_budget(clock: FakeClock) -> None:
    """The first worker crashed; the second, running the retry alone, vanished: nothing blames the input."""
    core = make_core(clock, heartbeat_ms=100, heartbeat_liveness=3)
    ready(core, b"W1")
    send(core, b"r", timeout_ms=5_000)
    take(core)
    core.worker_message(b"W1", wire.encode_disconnect("crashed"))
    ready(core, b"W2")
    assert len(dispatched(take(core))) == 1
    clock.advance(0.5)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_LOST and "retry budget is spent" in reply.message


def test_idle_models_are_forgotten_but_configured_ones_stay(clock: FakeClock) -> None:
    core = make_core(clock, heartbeat_ms=100_000)
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo(MODEL, "e", 2), ModelInfo("passing", "e", 2)), 4)))
    core.worker_message(b"W1", wire.encode_disconnect("bye"))
    clock.advance(FORGET_MODEL_S + SWEEP_EVERY_S)
    core.tick()
    assert set(core.models) == {MODEL}


def test_models_of_workers_that_came_and_went_are_bounded_in_number(clock: FakeClock) -> None:
    """A peer re-registering with fresh names cannot make the broker remember them all."""
    core = make_core(clock, heartbeat_ms=100_000)
    for number in range(MAX_WORKERLESS_MODELS + 500):
        names = tuple(ModelInfo(f"fake-{number}-{i}", "e", 1) for i in range(2))
        core.worker_message(b"rogue", wire.encode_ready(Ready(names, 1)))
    core.worker_message(b"rogue", wire.encode_disconnect("bye"))
    assert len(core.models) <= MAX_WORKERLESS_MODELS + 1  # and the configured model
    assert MODEL in core.models


def test_heartbeat_counters_are_kept_only_for_served_models_and_saturate(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    counters = BatchCounters(2**48, 2**48, 0, 0)
    names = {MODEL: counters} | {f"junk{i}": counters for i in range(100)}
    core.worker_message(b"W1", wire.encode_heartbeat(Heartbeat(names)))
    assert set(core.workers[b"W1"].batches) == {MODEL}
    assert add_counters(BatchCounters(MAX_TOTAL, 1, 0, 0), counters).batches == MAX_TOTAL
    payloads.encode_payload(core.stats())  # encodable whatever the workers said


def test_an_unknown_model_answer_names_a_bounded_number_of_models(clock: FakeClock) -> None:
    core = make_core(clock, models=tuple(f"model-{i:03}" for i in range(50)))
    clock.advance(1)
    send(core, b"r", model="nope")
    [reply] = client_replies(take(core))
    assert reply.status is Status.UNKNOWN_MODEL and "model-009" in reply.message
    assert "model-010" not in reply.message and "and 40 more" in reply.message


def test_repeated_refusals_are_logged_once_per_interval(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(clock)
    clock.advance(1)
    with caplog.at_level(logging.INFO, logger="zbatch.broker"):
        for number in range(1000):
            send(core, b"%d" % number, model="nope")
        clock.advance(11)
        send(core, b"last", model="nope")
    lines = [r.getMessage() for r in caplog.records if "unknown_model" in r.getMessage()]
    assert len(lines) == 2 and "and 999 more like it" in lines[1]
    assert len(client_replies(take(core))) == 1001


def test_a_client_heartbeat_is_answered_and_stats_say_the_limits(clock: FakeClock) -> None:
    core = make_core(clock, max_timeout_ms=2_000)
    core.client_message(b"C", wire.encode_heartbeat())
    [(peer, identity, frames)] = take(core)
    assert (peer.value, identity, frames) == ("client", b"C", wire.encode_heartbeat())
    limits = core.stats()["limits"]
    assert limits["timeout_ms"] == 1000 and limits["max_timeout_ms"] == 2000 and limits["max_backlog"] == 8
