"""The protocol defects a client written from PROTOCOL.md alone found, against a real broker.

Peers here are raw sockets (tests/hostile.py) speaking the protocol as the
spec allows or as a broken peer would; each test checks the rule of
PROTOCOL.md that settles the case.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.daemons import Daemon, broker_stats, start_broker, wait_until
from tests.hostile import HostileWorker
from zbatch.protocol import wire
from zbatch.protocol.wire import HIGH_PRIORITY, LOW_PRIORITY, Reply, Request, Status

MODEL = "m"
Context = zmq.Context[zmq.Socket[bytes]]
HEARTBEAT_MS = 200


@pytest.fixture
def context() -> Iterator[Context]:
    context: Context = zmq.Context()
    yield context
    context.term()


@pytest.fixture
def broker(log_dir: Path) -> Iterator[Daemon]:
    # A memory bound of 256 items, which the size tests below count against (the default is far larger).
    # Liveness 10 (2 s): the fake workers' heartbeat threads may stall on a busy host; only silence expires them.
    broker = start_broker(log_dir, models=(MODEL,), heartbeat_ms=HEARTBEAT_MS, heartbeat_liveness=10,
                          no_worker_grace_ms=10_000, max_backlog=256)
    yield broker
    broker.stop()


@pytest.fixture
def client(context: Context, broker: Daemon) -> Iterator[zmq.Socket[bytes]]:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(broker.frontend)
    yield socket
    socket.close(linger=0)


def worker(context: Context, broker: Daemon, name: bytes, capacity: int = 4) -> HostileWorker:
    peer = HostileWorker(context, broker.backend, name).start()
    peer.ready([MODEL], capacity)
    wait_until(lambda: any(w["identity"] == name.hex() for w in (broker_stats(broker.frontend) or {"workers": []})
                           ["workers"]), 10, f"worker {name!r} to register")
    return peer


def request(client: zmq.Socket[bytes], request_id: bytes, items: int = 1, **fields: object) -> None:
    client.send_multipart(wire.encode_request(Request(request_id, MODEL, items, b"payload", **fields)))  # type: ignore[arg-type]


def replies(client: zmq.Socket[bytes], wait_ms: int) -> list[Reply]:
    """Every REPLY that arrives within ``wait_ms`` of the last one."""
    answers = []
    while client.poll(wait_ms):
        frames = client.recv_multipart()
        if frames != wire.encode_heartbeat():
            answers.append(wire.decode_reply(frames))
    return answers


def test_a_cancelled_reply_nobody_asked_for_sends_the_request_to_another_worker(
        context: Context, broker: Daemon, client: zmq.Socket[bytes]) -> None:
    """A fake worker that lies (it answers ``cancelled`` unasked): the work was not done, an honest worker does it."""
    liar = worker(context, broker, b"fake-liar", capacity=1)
    honest = worker(context, broker, b"fake-honest", capacity=1)
    try:
        request(client, b"busy")
        request(client, b"r1")
        wait_until(lambda: liar.job_ids and honest.job_ids, 10, "a request on each worker")
        liar.reply(liar.job_ids[0], Status.CANCELLED, "skipped")
        honest.reply(honest.job_ids[0], Status.OK)
        wait_until(lambda: len(honest.job_ids) == 2, 10, "the liar's request to reach the honest worker")
        honest.reply(honest.job_ids[1], Status.OK)
        answers = {answer.request_id: answer.status for answer in replies(client, 2_000)}
        assert answers == {b"busy": Status.OK, b"r1": Status.OK}
        assert len(liar.job_ids) == 1  # it was not sent back to the worker that failed it
    finally:
        liar.close()
        honest.close()


def test_a_cancelled_reply_nobody_asked_for_with_no_other_worker_is_worker_lost_naming_it(
        context: Context, broker: Daemon, client: zmq.Socket[bytes]) -> None:
    liar = worker(context, broker, b"fake-liar")
    try:
        request(client, b"r1")
        wait_until(lambda: liar.job_ids, 10, "the request to reach the worker")
        liar.reply(liar.job_ids[0], Status.CANCELLED, "skipped")
        [answer] = replies(client, 5_000)
        assert (answer.request_id, answer.status) == (b"r1", Status.WORKER_LOST)
        assert "fake-liar" in answer.message and "not cancelled" in answer.message
    finally:
        liar.close()


def test_the_size_limit_is_the_requests_own_priority(context: Context, broker: Daemon,
                                                     client: zmq.Socket[bytes]) -> None:
    """300 items at high priority fit (its limit is 320); 200 at low never can (192): bad_request, not 'retry'."""
    request(client, b"high", items=300, priority=HIGH_PRIORITY)
    request(client, b"low", items=200, priority=LOW_PRIORITY)
    [answer] = replies(client, 1_000)
    assert (answer.request_id, answer.status) == (b"low", Status.BAD_REQUEST) and "split it" in answer.message
    assert broker_stats(broker.frontend)["models"][MODEL]["backlog_items"] == 300  # type: ignore[index]


def test_a_retry_whose_worker_goes_silent_is_worker_lost(context: Context, broker: Daemon,
                                                         client: zmq.Socket[bytes]) -> None:
    first = worker(context, broker, b"first")
    request(client, b"r1", timeout_ms=20_000)
    wait_until(lambda: first.job_ids, 10, "the request to reach the first worker")
    second = worker(context, broker, b"second")
    try:
        first.send(wire.encode_disconnect("crashed"))  # a crash: the request may be to blame, it is retried alone
        wait_until(lambda: second.job_ids, 10, "the retry to reach the second worker")
        second.silent = True  # its host froze: nothing says the input is to blame
        [answer] = replies(client, 10_000)
        assert (answer.request_id, answer.status) == (b"r1", Status.WORKER_LOST)
    finally:
        first.close()
        second.close()


def test_a_reused_live_id_gets_no_answer_and_the_live_request_gets_its_own(
        context: Context, broker: Daemon, client: zmq.Socket[bytes]) -> None:
    answering = worker(context, broker, b"answering")
    try:
        request(client, b"same")
        request(client, b"same")
        client.send_multipart(wire.encode_stats_query(b"same"))
        wait_until(lambda: answering.job_ids, 10, "the request to reach the worker")
        assert replies(client, 500) == []
        answering.reply(answering.job_ids[0], Status.OK)
        [answer] = replies(client, 5_000)
        assert (answer.request_id, answer.status) == (b"same", Status.OK)
        assert len(answering.job_ids) == 1
    finally:
        answering.close()


def test_a_client_heartbeat_is_answered_with_one(broker: Daemon, client: zmq.Socket[bytes]) -> None:
    client.send_multipart(wire.encode_heartbeat())
    assert client.poll(5_000)
    assert client.recv_multipart() == wire.encode_heartbeat()
