"""Hostile peers against a real broker over real sockets: oversized and garbage messages, clients
speaking worker commands, and clients reaching for other clients' requests.

The peers are raw DEALER sockets speaking the protocol by hand, so they can break it on purpose;
"the worker" below is one of them, serving model ``m``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

from tests.daemons import Daemon, broker_stats, start_broker, wait_until
from tests.zbatch.protocol_examples import EXAMPLES, expected_replies
from zbatch.protocol import wire
from zbatch.protocol.wire import Command, ModelInfo, Ready, Reply, Request, Status

MODEL = "m"
LIMIT = 4096  # max_message_bytes; libzmq drops frames over 4 times this
QUIET_S = 1.0  # how long "no answer" is waited for
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_broker(tmp_path_factory.mktemp("hostile"), models=(MODEL,), max_message_bytes=LIMIT,
                          heartbeat_liveness=30, timeout_ms=TIMEOUT_MS, max_timeout_ms=TIMEOUT_MS)
    yield daemon
    assert daemon.alive(), daemon.log()
    daemon.stop()
    assert "Traceback" not in daemon.log_path.read_text(), daemon.log()


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def dealer(context: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes | None = None) -> zmq.Socket[bytes]:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket[bytes], timeout_s: float) -> list[bytes] | None:
    return sock.recv_multipart() if sock.poll(int(timeout_s * 1000)) else None


def reply_to(sock: zmq.Socket[bytes], timeout_s: float = 5.0) -> Reply:
    frames = receive(sock, timeout_s)
    assert frames is not None, f"no reply within {timeout_s} s"
    return wire.decode_reply(frames)


def request(request_id: bytes, payload: bytes = b"\x80") -> list[bytes]:
    return wire.encode_request(Request(request_id, MODEL, 1, payload, TIMEOUT_MS))


def register_worker(context: zmq.Context[zmq.Socket[bytes]], broker: Daemon, name: str) -> zmq.Socket[bytes]:
    worker = dealer(context, broker.backend, name.encode())
    worker.send_multipart(wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4),), 8, name)))
    wait_until(lambda: name in worker_names(broker), 10, f"worker {name} to register", broker.log)
    return worker


def worker_names(broker: Daemon) -> list[str]:
    return [w["name"] for w in (broker_stats(broker.frontend) or {"workers": []})["workers"]]


def work_within(worker: zmq.Socket[bytes], seconds: float) -> list[list[bytes]]:
    """What the broker sends this worker for ``seconds``, heartbeats left out."""
    deadline = time.monotonic() + seconds
    received = []
    while (frames := receive(worker, max(0.0, deadline - time.monotonic()))) is not None:
        if frames != wire.encode_heartbeat():
            received.append(frames)
    return received


def next_job(worker: zmq.Socket[bytes]) -> Request:
    """The next REQUEST the broker sends this worker, skipping its heartbeats."""
    while (frames := receive(worker, 5.0)) is not None:
        message = wire.decode_broker_to_worker(frames)
        if isinstance(message, Request):
            return message
    raise AssertionError("the broker sent the worker no request")


def test_oversized_message_is_refused_unread_and_an_absurd_frame_drops_the_peer(
    broker: Daemon, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    client = dealer(context, broker.frontend)
    meta = msgpack.packb({"model": MODEL, "items": 1})
    big = [wire.HEADERS[Command.REQUEST], b"big", meta, b"\xc1" * LIMIT]
    client.send_multipart(big)
    reply = reply_to(client)
    assert (reply.request_id, reply.status) == (b"big", Status.BAD_REQUEST)
    assert f"message too large: {sum(map(len, big))} bytes, the limit is {LIMIT}" in reply.message
    absurd = dealer(context, broker.frontend)
    dropped = absurd.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    absurd.send_multipart([wire.HEADERS[Command.REQUEST], b"absurd", meta, b"\x00" * (4 * LIMIT + 1)])
    assert receive(dropped, 5.0) is not None, "libzmq did not cut the connection"
    assert receive(absurd, QUIET_S) is None  # and the broker never saw the message
    client.send_multipart(wire.encode_stats_query(b"after"))
    assert reply_to(client).status is Status.OK


def test_frontend_peer_cannot_act_as_a_worker(broker: Daemon, context: zmq.Context[zmq.Socket[bytes]]) -> None:
    """READY and REPLY on the frontend are refused, register nothing and answer nobody."""
    worker = register_worker(context, broker, "honest")
    victim, attacker = dealer(context, broker.frontend), dealer(context, broker.frontend)
    victim.send_multipart(request(b"victim-1", b"\x81\xa6inputs\x91\xa1x"))
    job = next_job(worker)
    forged_ready = wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4),), 1000, "impostor"))
    attacker.send_multipart([forged_ready[0], b"ready-id", forged_ready[1]])
    assert reply_to(attacker).status is Status.BAD_REQUEST
    for request_id in (job.request_id, b"victim-1"):
        attacker.send_multipart(wire.encode_reply(Reply(request_id, Status.OK, "", b"forged")))
        forged = reply_to(attacker)
        assert (forged.request_id, forged.status) == (request_id, Status.BAD_REQUEST)
        assert "not allowed from a client" in forged.message
    assert receive(victim, QUIET_S) is None
    assert "impostor" not in worker_names(broker)
    worker.send_multipart(wire.encode_reply(Reply(job.request_id, Status.OK, "", b"genuine")))
    genuine = reply_to(victim)
    assert (genuine.request_id, genuine.status, genuine.payload) == (b"victim-1", Status.OK, b"genuine")
    worker.send_multipart(wire.encode_disconnect("done"))


def test_a_client_cannot_cancel_or_collide_with_another_clients_request(
    broker: Daemon, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    worker = register_worker(context, broker, "patient")
    owner, other = dealer(context, broker.frontend), dealer(context, broker.frontend)
    owner.send_multipart(request(b"shared-id"))
    job = next_job(worker)
    other.send_multipart(wire.encode_cancel(b"shared-id"))
    other.send_multipart(request(b"shared-id"))  # same id, other connection: a request of its own
    second = next_job(worker)
    assert second.request_id != job.request_id
    assert work_within(worker, QUIET_S) == []  # no CANCEL reached the worker
    worker.send_multipart(wire.encode_reply(Reply(job.request_id, Status.OK, "", b"for-owner")))
    worker.send_multipart(wire.encode_reply(Reply(second.request_id, Status.OK, "", b"for-other")))
    assert reply_to(owner).payload == b"for-owner"
    assert reply_to(other).payload == b"for-other"
    worker.send_multipart(wire.encode_disconnect("done"))


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    """A valid message with one to three random byte or frame mutations."""
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(frames)) if frames else 0
        kind = rng.choice(("flip", "cut", "dup", "drop", "junk"))
        if kind == "flip" and frames and frames[at]:
            raw = bytearray(frames[at])
            raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
            frames[at] = bytes(raw)
        elif kind == "cut" and frames:
            frames[at] = frames[at][: rng.randint(0, len(frames[at]))]
        elif kind == "dup" and frames:
            frames.insert(at, frames[at])
        elif kind == "drop" and frames:
            del frames[at]
        else:
            frames.insert(at, rng.randbytes(rng.randint(0, 40)))
    return frames or [b""]


HOSTILE_MESSAGES = 1500


def test_mutated_traffic_on_both_sockets_is_answered_once_per_request(
    tmp_path: Path, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    broker = start_broker(tmp_path, models=(MODEL,), max_message_bytes=LIMIT, timeout_ms=500,
                          max_timeout_ms=500, no_worker_grace_ms=200)
    try:
        rng = random.Random(20240601)
        clients = [dealer(context, broker.frontend) for _ in range(3)]
        workers = [dealer(context, broker.backend, b"fuzz-%d" % i) for i in range(3)]
        valid = list(EXAMPLES.values())
        expected: Counter[tuple[int, bytes]] = Counter()
        heartbeat = wire.encode_heartbeat()
        heartbeats_sent = heartbeats_answered = 0  # a client's HEARTBEAT is answered with one
        for number in range(HOSTILE_MESSAGES):
            frames = mutate(rng, rng.choice(valid))
            which = rng.randrange(3)
            heartbeats_sent += frames == heartbeat
            if wire.request_id_of(frames) is not None:
                frames[1] = b"m%d" % number  # unique ids: each answer names its message
                expected[(which, frames[1])] += expected_replies(frames)
            clients[which].send_multipart(frames)
            rng.choice(workers).send_multipart(mutate(rng, rng.choice(valid)))
        expected = +expected
        answered: Counter[tuple[int, bytes]] = Counter()

        def collect() -> bool:
            nonlocal heartbeats_answered
            for which, client in enumerate(clients):
                while client.poll(0):
                    frames = client.recv_multipart()
                    if frames == heartbeat:
                        heartbeats_answered += 1
                    else:
                        answered[(which, wire.decode_reply(frames).request_id)] += 1
            return sum(answered.values()) >= sum(expected.values()) and heartbeats_answered >= heartbeats_sent

        wait_until(collect, 20, "an answer to every hostile request", broker.log)
        assert receive(clients[0], QUIET_S) is None
        collect()
        assert answered == expected
        assert heartbeats_answered == heartbeats_sent
        assert broker_stats(broker.frontend) is not None
    finally:
        broker.stop()
    assert "Traceback" not in broker.log_path.read_text(), broker.log()
