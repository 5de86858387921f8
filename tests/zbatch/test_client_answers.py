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


def test_a_request_still_waiting_for_its_connection_is_refused_here_once_the_breaker_covers_it() -> None:
    """No broker listens, so the request's sends fail while the connection is tried; meanwhile another request
    of the same size is refused by the broker (its verdict recorded here as the client records it).  The
    waiting request gets that overloaded answer at once, not BrokerUnavailable at the connect timeout."""
    from zbatch.testing import free_port

    async def scenario() -> tuple[wire.Reply, float]:
        async with AsyncClient(f"tcp://127.0.0.1:{free_port()}", connect_timeout_ms=5_000) as client:
            loop = asyncio.get_running_loop()
            started = loop.time()
            waiting = asyncio.create_task(client.request("m", b"", items=32, timeout_ms=5_000))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert client._breaker is not None
            client._breaker.refused((0, "m"), 32, 5_000, wire.NORMAL_PRIORITY, retry_after_ms=800)
            reply = await waiting
            return reply, loop.time() - started

    reply, elapsed_s = asyncio.run(scenario())
    assert reply.status is wire.Status.OVERLOADED and 0 < (reply.retry_after_ms or 0) <= 800
    assert elapsed_s < 1.0  # the next send attempt, 5 ms on, not the 5 s connect timeout


def grouping_broker(ready: threading.Event, done: threading.Event, asked: list[bool]) -> str:
    """A ROUTER that answers two REQUESTs in one REPLIES: the one whose payload is ``good`` with ``ok``, the other
    with a status this client does not know; ``asked`` records whether each request said it takes grouped
    answers."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        ready.set()
        answers: list[bytes] = []
        ok = msgpack.packb({"status": "ok", "message": ""})
        odd = msgpack.packb({"status": "brand_new_status", "message": "from a newer broker"})
        try:
            while not done.is_set() and len(asked) < 2:
                if not router.poll(100):
                    continue
                peer, *frames = router.recv_multipart()
                if frames[0] == wire.HEADERS[wire.Command.REQUEST]:
                    answers += [frames[1], ok if frames[3] == b"good" else odd, b""]
                    asked.append(msgpack.unpackb(frames[2]).get("grouped") is True)
            router.send_multipart([peer, wire.HEADERS[wire.Command.REPLIES], *answers])
            done.wait(10)
        finally:
            router.close(linger=0)

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{port}"


def test_grouped_answers_end_each_request_on_its_own() -> None:
    ready, done = threading.Event(), threading.Event()
    asked: list[bool] = []
    endpoint = grouping_broker(ready, done, asked)
    ready.wait(5)

    async def ask() -> tuple[wire.Reply | BaseException, wire.Reply | BaseException]:
        async with AsyncClient(endpoint, timeout_ms=60_000) as client:
            return await asyncio.gather(client.request("m", b"good", items=1), client.request("m", b"odd", items=1),
                                        return_exceptions=True)

    try:
        first, second = asyncio.run(ask())
    finally:
        done.set()
    assert asked == [True, True]
    assert isinstance(first, wire.Reply) and first.status is wire.Status.OK
    assert isinstance(second, ZBatchError) and not isinstance(second, BrokerUnavailable)
    assert "unknown status" in str(second)
