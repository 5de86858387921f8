"""Grouped answers (PROTOCOL.md 3.10) through the broker's core, with fake frames and a fake clock."""

from __future__ import annotations

import pytest

from broker.core import BrokerCore, Peer
from tests.broker.test_core import FakeClock, client_replies, dispatched, make_core, ready, send, take
from zbatch.protocol import wire
from zbatch.protocol.wire import Command, ModelInfo, Ready, Reply, Request, Status


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def grouped_from_worker(core: BrokerCore, worker: bytes, replies: list[Reply]) -> None:
    [frames] = wire.encode_grouped(replies)
    assert frames[0] == wire.HEADERS[Command.REPLIES]
    core.worker_message(worker, frames)


def to_client(out: list[tuple[Peer, bytes, list[bytes]]], client: bytes) -> list[list[bytes]]:
    return [frames for peer, identity, frames in out if peer is Peer.CLIENT and identity == client]


def answers(messages: list[list[bytes]]) -> list[Reply]:
    """Every answer the messages carry, REPLY or REPLIES alike."""
    replies = []
    for frames in messages:
        parts = wire.split_grouped(frames) if frames[0] == wire.HEADERS[Command.REPLIES] else [frames]
        replies += [wire.decode_reply(part) for part in parts]
    return replies


def grouped_ready(core: BrokerCore, identity: bytes, capacity: int = 8) -> None:
    core.worker_message(identity, wire.encode_ready(Ready((ModelInfo("m", "embeddings", 2),), capacity,
                                                          grouped=True)))


def test_requests_are_marked_grouped_for_a_worker_that_said_so_whatever_their_client_sent(clock: FakeClock) -> None:
    """An older worker, whose READY says nothing of grouping, gets no key it may not know."""
    for says_so in (True, False):
        core = make_core(clock)
        (grouped_ready if says_so else ready)(core, b"W1", 4)
        send(core, b"r1")
        send(core, b"r2", grouped=True)
        assert [job.grouped for _, job in dispatched(take(core))] == [says_so, says_so]


def test_a_worker_s_grouped_answers_reach_a_grouped_client_in_one_message(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    for index in range(3):
        send(core, b"r%d" % index, grouped=True)
    jobs = [job for _, job in dispatched(take(core))]
    grouped_from_worker(core, b"W1", [Reply(job.request_id, Status.OK, "", b"v%d" % n) for n, job in enumerate(jobs)])
    [message] = to_client(take(core), b"C")
    assert message[0] == wire.HEADERS[Command.REPLIES]
    assert answers([message]) == [Reply(b"r%d" % n, Status.OK, "", b"v%d" % n) for n in range(3)]
    assert core.stats()["models"]["m"]["in_flight_items"] == 0  # each answer gave its credit back


def test_clients_that_did_not_ask_get_one_reply_each_and_each_client_its_own(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"a1", client=b"A", grouped=True)
    send(core, b"a2", client=b"A", grouped=True)
    send(core, b"b1", client=b"B")
    send(core, b"b2", client=b"B")
    jobs = [job for _, job in dispatched(take(core))]
    grouped_from_worker(core, b"W1", [Reply(job.request_id, Status.OK, "", b"v") for job in jobs])
    out = take(core)
    [to_a] = to_client(out, b"A")
    assert to_a[0] == wire.HEADERS[Command.REPLIES]
    assert [reply.request_id for reply in answers([to_a])] == [b"a1", b"a2"]
    to_b = to_client(out, b"B")
    assert [frames[0] for frames in to_b] == [wire.HEADERS[Command.REPLY]] * 2
    assert [reply.request_id for reply in client_replies([(Peer.CLIENT, b"B", f) for f in to_b])] == [b"b1", b"b2"]


def test_a_lone_answer_to_a_grouped_client_is_a_plain_reply(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r1", grouped=True)
    [(_, job)] = dispatched(take(core))
    core.worker_message(b"W1", wire.encode_reply(Reply(job.request_id, Status.OK, "", b"v")))
    [message] = to_client(take(core), b"C")
    assert wire.decode_reply(message) == Reply(b"r1", Status.OK, "", b"v")


def test_grouped_answers_are_each_judged_as_a_reply(clock: FakeClock) -> None:
    """A stale id is skipped, a duplicate answers nothing twice, a declined job goes back to wait."""
    core = make_core(clock)
    ready(core, b"W1", capacity=2)
    send(core, b"r1", grouped=True)
    send(core, b"r2", grouped=True)
    first, second = [job for _, job in dispatched(take(core))]
    grouped_from_worker(core, b"W1", [
        Reply(b"not-a-job", Status.OK, "", b"x"),
        Reply(first.request_id, Status.OK, "", b"v1"),
        Reply(first.request_id, Status.OK, "", b"again"),
        Reply(second.request_id, Status.DECLINED, "full"),
    ])
    out = take(core)
    assert answers(to_client(out, b"C")) == [Reply(b"r1", Status.OK, "", b"v1")]
    assert core.stats()["models"]["m"]["backlog_items"] == 1  # the declined job waits for a worker's share


def test_a_malformed_group_from_a_worker_is_dropped_and_its_requests_end_at_their_deadline(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r1", grouped=True, timeout_ms=200)
    [(_, job)] = dispatched(take(core))
    ok = wire.pack({"status": "ok"})
    core.worker_message(b"W1", [wire.HEADERS[Command.REPLIES], job.request_id, ok, b"v", b"x", b"not msgpack", b""])
    assert to_client(take(core), b"C") == []
    clock.advance(0.25)
    core.tick()
    [reply] = answers(to_client(take(core), b"C"))
    assert reply.request_id == b"r1" and reply.status is Status.DEADLINE_EXCEEDED


def test_a_client_may_not_send_grouped_answers(clock: FakeClock) -> None:
    core = make_core(clock)
    [frames] = wire.encode_grouped([Reply(b"a", Status.OK), Reply(b"b", Status.OK)])
    core.client_message(b"C", frames)
    [reply] = answers(to_client(take(core), b"C"))
    assert reply.request_id == b"a" and reply.status is Status.BAD_REQUEST and "REPLIES" in reply.message


def test_a_grouped_request_round_trips_through_the_client_side_codec() -> None:
    request = Request(b"r", "m", 1, b"", grouped=True)
    assert wire.decode_client_message(wire.encode_request(request)) == request
