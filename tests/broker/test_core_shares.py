"""A worker of several brokers, as one broker's core sees it: capacity shares and ``declined`` (PROTOCOL.md 6.6)."""

from __future__ import annotations

import pytest

from broker.core import BrokerCore
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
from zbatch.protocol import wire
from zbatch.protocol.wire import Heartbeat, Status


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def share(core: BrokerCore, identity: bytes, capacity: int) -> None:
    core.worker_message(identity, wire.encode_heartbeat(Heartbeat(capacity=capacity)))


def test_a_heartbeat_share_replaces_the_capacity_of_ready(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=4)
    share(core, b"W1", 2)
    for i in range(4):
        send(core, b"r%d" % i)
    assert len(dispatched(take(core))) == 2
    assert core.stats()["workers"][0]["capacity"] == 2


def test_a_larger_share_dispatches_what_waits_at_once(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=1)
    send(core, b"r1")
    send(core, b"r2")
    assert len(dispatched(take(core))) == 1
    share(core, b"W1", 2)
    assert [job.payload for _, job in dispatched(take(core))] == [b"P"]


def test_a_share_of_zero_gets_nothing_not_even_a_large_request(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=4)
    share(core, b"W1", 0)
    send(core, b"big", items=6)
    send(core, b"small")
    assert dispatched(take(core)) == []
    share(core, b"W1", 4)
    assert len(dispatched(take(core))) == 1  # the large one, alone on an idle worker


def test_a_declined_request_goes_back_to_the_head_uncharged_and_unanswered(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=0)
    ready(core, b"W1", capacity=2)
    send(core, b"r1")
    send(core, b"r2")
    send(core, b"r3")
    (_, first), (_, second) = dispatched(take(core))
    worker_reply(core, b"W1", first.request_id, Status.DECLINED)
    out = take(core)
    assert client_replies(out) == [] and dispatched(out) == []  # capacity down to what it holds: 1
    assert core.stats()["workers"][0]["declined"] == 1
    share(core, b"W1", 2)
    [(_, again)] = dispatched(take(core))
    assert again.request_id == first.request_id  # the head of the backlog, before r3
    worker_reply(core, b"W1", again.request_id)
    worker_reply(core, b"W1", second.request_id)
    replies = client_replies(take(core))
    assert [r.request_id for r in replies] == [b"r1", b"r2"] and {r.status for r in replies} == {Status.OK}


def test_a_declined_request_goes_to_another_worker_with_room(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=1)
    send(core, b"r1")
    [(worker, job)] = dispatched(take(core))
    ready(core, b"W2", capacity=1)
    worker_reply(core, worker, job.request_id, Status.DECLINED)
    [(other, again)] = dispatched(take(core))
    assert other != worker and again.request_id == job.request_id


def test_a_declined_request_that_was_already_answered_is_forgotten(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=1)
    send(core, b"r1", timeout_ms=100)
    [(_, job)] = dispatched(take(core))
    clock.advance(0.2)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.DEADLINE_EXCEEDED
    worker_reply(core, b"W1", job.request_id, Status.DECLINED)
    assert client_replies(take(core)) == [] and not core.jobs
    assert core.stats()["models"][MODEL]["backlog_items"] == 0
