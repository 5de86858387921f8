"""Answers a client must handle without waiting out its timeout: a status it does not know, a stray 'cancelled'.

The broker here is a FAKE: a raw ROUTER socket in the test that answers as a
newer or a broken broker would, which a real broker never does.
"""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
import zmq

from zbatch.client import AsyncClient, BrokerUnavailable, ZBatchError
from zbatch.protocol import wire


def fake_broker(status: str, ready: threading.Event, done: threading.Event) -> str:
    """A ROUTER that answers the first REQUEST with ``status``; returns its endpoint."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        ready.set()
        try:
            while not done.is_set():
                if not router.poll(100):
                    continue
                peer, *frames = router.recv_multipart()
                if frames[0] != wire.HEADERS[wire.Command.REQUEST]:
                    continue
                meta = msgpack.packb({"status": status, "message": "from a newer broker"})
                router.send_multipart([peer, wire.HEADERS[wire.Command.REPLY], frames[1], meta, b""])
        finally:
            router.close(linger=0)

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize(("status", "complaint"), [
    ("brand_new_status", "unknown status"),
    ("cancelled", "status cancelled"),
])
def test_an_answer_the_client_cannot_use_ends_its_request_at_once(status: str, complaint: str) -> None:
    ready, done = threading.Event(), threading.Event()
    endpoint = fake_broker(status, ready, done)
    ready.wait(5)

    async def ask() -> BaseException:
        async with AsyncClient(endpoint, timeout_ms=60_000) as client:
            try:
                await client.infer("m", ["x"])
            except ZBatchError as exc:
                return exc
        raise AssertionError("the request succeeded")

    try:
        error = asyncio.run(ask())
    finally:
        done.set()
    assert not isinstance(error, BrokerUnavailable), error  # that would be the 60 s timeout
    assert complaint in str(error)
