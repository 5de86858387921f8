"""Hostile clients while normal traffic flows: every normal request still succeeds,
no process dies, none grows without bound.

Raw DEALER sockets send mutated, truncated, oversized, wrong-version and forged
messages to both broker sockets; a raw TCP client sends malformed HTTP to the
gateway.  Meanwhile a steady closed-loop load goes through the gateway.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.broker.test_hostile_sockets import mutate
from tests.daemons import Daemon, running_stack, wait_until
from tests.load import Load
from tests.zbatch.protocol_examples import EXAMPLES
from worker.runners import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
ZMQ_MESSAGES_PER_SOCKET = 3000
RSS_GROWTH_LIMIT_KB = 64 * 1024
MALFORMED_HTTP = [
    b"\x00\xff garbage that is not HTTP at all\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n",  # truncated: no end of headers
    b"POST /models/" + MODEL.encode() + b" HTTP/1.1\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{",
    b"POST / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
    b"POST /models/" + MODEL.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 18\r\n\r\n{\"inputs\": [[[]]]}",
    b"BREW /coffee HTCPCP/1.0\r\n\r\n",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\nzz\r\nxx\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
]


def rss_kb(daemon: Daemon) -> int:
    with open(f"/proc/{daemon.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {daemon.name}")


@pytest.fixture
def stack(log_dir: Path) -> Iterator[dict[str, Daemon]]:
    with running_stack(log_dir, workers=1) as daemons:
        yield daemons


def hostile_zmq(stack: dict[str, Daemon], rng: random.Random) -> int:
    """Mutated and forged traffic on both broker sockets; returns how many messages were sent."""
    context = zmq.Context()
    sent = 0
    try:
        for endpoint in (stack["broker"].frontend, stack["broker"].backend):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, 1000)
            sock.setsockopt(zmq.ROUTING_ID, b"hostile-%d" % sent)
            sock.connect(endpoint)
            valid = list(EXAMPLES.values())
            specials = [[os.urandom(2_000_000)], [b"ZB\x09\x02", b"id", b"", b""], [b"ZB"], [b""] * 50]
            for number in range(ZMQ_MESSAGES_PER_SOCKET):
                frames = rng.choice(specials) if number % 100 == 0 else mutate(rng, rng.choice(valid))
                try:
                    sock.send_multipart(frames)
                    sent += 1
                except zmq.Again:
                    pass  # the broker may cut a peer off for an absurd frame; keep going
            sock.close()
    finally:
        context.term()
    return sent


def hostile_http(stack: dict[str, Daemon]) -> int:
    port = int(stack["gateway"].url.rsplit(":", 1)[1])
    for raw in MALFORMED_HTTP:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_WR)
            answer = conn.recv(65536)
            assert b"Traceback" not in answer and b'File "' not in answer
    return len(MALFORMED_HTTP)


def test_hostile_clients_do_not_hurt_normal_traffic(stack: dict[str, Daemon]) -> None:
    rng = random.Random(7)
    url = f"{stack['gateway'].url}/models/{MODEL}"
    with Load(url, concurrency=4) as load:
        wait_until(lambda: load.successes() >= 20, 60, "normal traffic to flow")
        before = {name: rss_kb(daemon) for name, daemon in stack.items()}
        zmq_sent = hostile_zmq(stack, rng)
        http_sent = hostile_http(stack)
        ok_after_attack = load.successes()
        wait_until(lambda: load.successes() >= ok_after_attack + 20, 60, "normal traffic after the attack")
        load.stop()
        summary = load.summary()
    growth = {name: rss_kb(daemon) - before[name] for name, daemon in stack.items()}
    print(f"\nFIGURES hostile: zmq={zmq_sent} http={http_sent} normal={summary} rss_growth_kb={growth}")
    assert all(daemon.alive() for daemon in stack.values())
    assert summary["sent"] == summary["answered"] == summary["ok"], summary
    # The worker's memory follows torch's allocator and batch shapes, not hostile input: reported only.
    assert growth["broker"] < RSS_GROWTH_LIMIT_KB and growth["gateway"] < RSS_GROWTH_LIMIT_KB, growth
