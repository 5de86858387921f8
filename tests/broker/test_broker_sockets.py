"""The broker daemon over real ZeroMQ sockets on loopback, with real worker processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.daemons import Daemon, broker_stats, start_broker, start_worker, wait_until
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient, DeadlineExceeded, Overloaded, UnknownModel
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Status

MODEL = DEFAULT_MODEL_NAME


def test_pipelined_requests_on_one_socket_get_their_own_answers(stack: dict[str, Daemon]) -> None:
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'ships'}" for i in range(48)]

    async def run() -> tuple[list[np.ndarray], list[np.ndarray]]:
        async with AsyncClient(stack["broker"].frontend) as client:
            together = await asyncio.gather(*(client.infer(MODEL, [t]) for t in texts))
            alone = [await client.infer(MODEL, [t]) for t in texts[:4]]
        return [r[0] for r in together], [r[0] for r in alone]

    together, alone = asyncio.run(run())
    assert len(together) == len(texts)
    for i, vector in enumerate(alone):
        np.testing.assert_allclose(together[i], vector, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_load_spreads_across_both_workers(stack: dict[str, Daemon]) -> None:
    def batches_by_worker() -> dict[str, int]:
        stats = broker_stats(stack["broker"].frontend) or {"workers": []}
        return {w["identity"]: w["batches"].get(MODEL, {}).get("batches", 0) for w in stats["workers"]}

    before = batches_by_worker()  # the stack is the module's: earlier tests ran batches too

    async def burst() -> None:
        async with AsyncClient(stack["broker"].frontend) as client:
            await asyncio.gather(*(client.infer(MODEL, [f"text {i}"] * 2) for i in range(64)))

    asyncio.run(burst())

    def both_batched() -> bool:
        counts = batches_by_worker()
        return len(counts) == 2 and counts.keys() == before.keys() and all(counts[w] > before[w] for w in counts)

    wait_until(both_batched, 10, "both workers to report batches", stack["broker"].log)


@pytest.fixture
def small_broker(log_dir: Path) -> Iterator[tuple[Daemon, Daemon]]:
    broker = start_broker(log_dir, max_backlog=4)
    worker = start_worker(broker, log_dir, "slow", capacity=1, max_batch_size=1)
    try:
        yield broker, worker
    finally:
        worker.stop()
        broker.stop()


def test_shedding_at_the_backlog_limit_answers_every_request(small_broker: tuple[Daemon, Daemon]) -> None:
    broker, _ = small_broker

    async def burst() -> list[object]:
        # Every request must reach the broker: the client's breaker would refuse some itself
        # once the first refusal is back (tests/broker/test_client.py covers that).
        async with AsyncClient(broker.frontend, fail_fast_overload=False) as client:
            calls = (client.infer(MODEL, [f"burst {i} " * 20]) for i in range(40))
            return list(await asyncio.gather(*calls, return_exceptions=True))

    results = asyncio.run(burst())
    assert len(results) == 40
    shed = [r for r in results if isinstance(r, Overloaded)]
    served = [r for r in results if isinstance(r, list)]
    assert shed and served and len(shed) + len(served) == 40
    assert all(e.retry_after_ms and e.retry_after_ms > 0 for e in shed)
    stats = broker_stats(broker.frontend)
    assert stats is not None and stats["models"][MODEL]["requests"]["overloaded"] == len(shed)


def test_deadline_expires_while_waiting(log_dir: Path) -> None:
    broker = start_broker(log_dir, models=(MODEL,), no_worker_grace_ms=60_000)
    try:
        async def ask() -> None:
            async with AsyncClient(broker.frontend) as client:
                await client.infer(MODEL, ["nobody will run this"], timeout_ms=100)

        with pytest.raises(DeadlineExceeded, match="deadline"):
            asyncio.run(ask())
    finally:
        assert broker.stop() == 0


def test_unknown_model_is_refused(stack: dict[str, Daemon]) -> None:
    async def ask() -> None:
        async with AsyncClient(stack["broker"].frontend) as client:
            await client.infer("no-such-model", ["x"])

    with pytest.raises(UnknownModel, match="no-such-model"):
        asyncio.run(ask())


def test_malformed_frames_from_a_raw_dealer_never_hurt_the_broker(stack: dict[str, Daemon]) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(stack["broker"].frontend)
    try:
        hostile = [
            [b"garbage"],
            [b""],
            [b"ZB\x01\x02", b"no-meta"],
            [b"ZB\x07\x02", b"wrong-version", b"", b""],
            [b"ZB\x01\x02", b"bad-meta", b"\xc1\xc1", b"payload"],
            [b"ZB\x01\x01", b"worker-command"],
            [b"ZB\x01\x02", b"neg-items", wire.pack({"model": MODEL, "items": -3}), b""],
        ]
        for frames in hostile:
            dealer.send_multipart(frames)
        answered = {}
        for _ in range(5):  # five of them carry a usable request id
            reply = wire.decode_reply(dealer.recv_multipart())
            answered[reply.request_id] = reply.status
        assert answered == {
            b"no-meta": Status.BAD_REQUEST,
            b"wrong-version": Status.BAD_REQUEST,
            b"bad-meta": Status.BAD_REQUEST,
            b"worker-command": Status.BAD_REQUEST,
            b"neg-items": Status.BAD_REQUEST,
        }
        good = payloads.encode_payload({"inputs": ["still fine"], "parameters": {}})
        dealer.send_multipart(wire.encode_request(wire.Request(b"good", MODEL, 1, good)))
        reply = wire.decode_reply(dealer.recv_multipart())
        assert (reply.request_id, reply.status) == (b"good", Status.OK)
    finally:
        dealer.close()
        context.term()
    assert stack["broker"].alive()
