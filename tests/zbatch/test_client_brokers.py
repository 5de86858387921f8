"""AsyncClient with several brokers: spreading, a hung or vanished broker, replay, rejoin, one answer per request;
with one broker: a restart waited for.

The brokers here are FAKES: ROUTER sockets in the test's loop that answer
every REQUEST at once with their own name, answer heartbeats, and can hang
(stop reading, as a SIGSTOPped broker) or vanish (close, as a killed one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq
import zmq.asyncio

from zbatch.client import AsyncClient, BrokerUnavailable
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Command, Reply, Status

# A window of 0.5 s: short, yet longer than the stalls of a busy host's scheduler (a live broker stays live).
FAST = {"heartbeat_ms": 50, "heartbeat_liveness": 10}


class FakeBroker:
    def __init__(self, context: zmq.asyncio.Context, name: str, endpoint: str = "") -> None:
        """``endpoint``: the one a vanished broker had, for its restart; empty: a free port."""
        self.name = name
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        if endpoint:
            self.router.bind(endpoint)
            self.endpoint = endpoint
        else:
            self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.running = asyncio.Event()
        self.running.set()
        self.answering = True
        self.status = Status.OK
        self.requests: list[bytes] = []
        self.cancels: list[bytes] = []
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            peer, *frames = await self.router.recv_multipart()
            await self.running.wait()  # hung: what arrives waits, as in a stopped process
            command = wire.decode_header(frames)
            if command is Command.HEARTBEAT:
                await self.router.send_multipart([peer, *frames])
            elif command is Command.CANCEL:
                self.cancels.append(frames[1])
            elif command is Command.STATS:
                stats = {"uptime_s": 1.0, "draining": False, "models": {"m": {"requests": {"ok": len(self.requests)}}},
                         "workers": []}
                reply = Reply(frames[1], Status.OK, "", payloads.encode_payload(stats))
                await self.router.send_multipart([peer, *wire.encode_reply(reply)])
            elif command is Command.REQUEST:
                self.requests.append(frames[1])
                if self.answering:
                    payload = payloads.encode_payload({"outputs": [self.name]}) if self.status is Status.OK else b""
                    reply = Reply(frames[1], self.status, "no worker here", payload)
                    await self.router.send_multipart([peer, *wire.encode_reply(reply)])

    def hang(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    async def vanish(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.router.close(linger=0)


@contextlib.asynccontextmanager
async def connected(names: tuple[str, ...], timeout_ms: int = 20_000, **options: Any
                    ) -> AsyncIterator[tuple[AsyncClient, list[FakeBroker], zmq.asyncio.Context]]:
    """A client of a fake broker for each name, every one connected; the context makes more (a restart)."""
    context = zmq.asyncio.Context()
    brokers = [FakeBroker(context, name) for name in names]
    client = AsyncClient([broker.endpoint for broker in brokers], context=context, timeout_ms=timeout_ms,
                         **(FAST | options))
    try:
        await client.stats()  # every one connected: requests go in turn from the first one on
        yield client, brokers, context
    finally:
        await client.close()
        for broker in brokers:
            if not broker.router.closed:
                await broker.vanish()
        context.term()


@contextlib.asynccontextmanager
async def fleet(**options: Any) -> AsyncIterator[tuple[AsyncClient, FakeBroker, FakeBroker]]:
    async with connected(("a", "b"), **options) as (client, (a, b), _):
        yield client, a, b


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


def test_requests_spread_over_both_brokers() -> None:
    async def scenario() -> list[str]:
        async with fleet() as (client, _, _):
            return [(await client.infer("m", ["x"]))[0] for _ in range(10)]

    answers = asyncio.run(scenario())
    assert answers.count("a") == answers.count("b") == 5


def test_a_connected_client_gives_a_broker_that_hangs_before_its_first_request_up() -> None:
    """connect() starts the heartbeats: a broker hung before any request is given up within the liveness
    window, and the first requests go to the live one without waiting for it (a gateway process's case)."""

    async def scenario() -> list[str]:
        context = zmq.asyncio.Context()
        a, b = FakeBroker(context, "a"), FakeBroker(context, "b")
        client = AsyncClient([a.endpoint, b.endpoint], context=context, timeout_ms=20_000,
                             heartbeat_ms=FAST["heartbeat_ms"], heartbeat_liveness=FAST["heartbeat_liveness"])
        try:
            await client.connect()
            a.hang()
            await until(lambda: not client.brokers[0].live)
            async with asyncio.timeout(5.0):  # far below the 20 s a request would wait at the hung broker
                return [(await client.infer("m", [str(i)]))[0] for i in range(4)]
        finally:
            await client.close()
            for broker in (a, b):
                await broker.vanish()
            context.term()

    assert asyncio.run(scenario()) == ["b"] * 4


def test_a_hung_broker_is_given_up_its_requests_replayed_and_it_rejoins_when_it_answers() -> None:
    async def scenario() -> dict[str, Any]:
        async with fleet() as (client, a, b):
            await client.infer("m", ["warm"])
            a.hang()
            loop = asyncio.get_running_loop()
            hung_at = loop.time()
            # Placed before any answer: three go to a, which hangs, and come back from b.
            answers = await asyncio.gather(*(client.infer("m", [str(i)]) for i in range(6)))
            detected_s = loop.time() - hung_at
            assert not client.brokers[0].live
            a.resume()
            await until(lambda: client.brokers[0].live)
            await until(lambda: len(a.cancels) >= 3)
            after = [(await client.infer("m", ["again"]))[0] for _ in range(4)]
            return {"answers": answers, "detected_s": detected_s, "cancels": a.cancels, "after": after,
                    "moved": [r for r in a.requests if r in b.requests]}

    result = asyncio.run(scenario())
    assert [answer[0] for answer in result["answers"]] == ["b"] * 6
    assert result["detected_s"] < 5.0  # 50 ms x 10, and replay, on a busy machine: far below the 20 s timeout
    assert sorted(result["cancels"]) == sorted(result["moved"]) and len(result["moved"]) == 3
    assert "a" in result["after"]


def test_a_vanished_broker_loses_nothing_and_no_request_is_answered_twice() -> None:
    async def scenario() -> list[Any]:
        async with fleet() as (client, a, _):
            a.answering = False
            calls = [asyncio.create_task(client.infer("m", [str(i)])) for i in range(4)]
            await until(lambda: len(a.requests) == 2)
            await a.vanish()
            return list(await asyncio.gather(*calls))

    assert [answer[0] for answer in asyncio.run(scenario())] == ["b"] * 4


def test_without_replay_the_requests_of_a_dead_broker_fail_fast() -> None:
    async def scenario() -> list[Any]:
        async with fleet(replay=False) as (client, a, _):
            a.hang()
            calls = [asyncio.create_task(client.infer("m", [str(i)])) for i in range(4)]
            return list(await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5))

    answers = asyncio.run(scenario())
    failures = [a for a in answers if isinstance(a, BrokerUnavailable)]
    assert len(failures) == 2 and "without an answer to heartbeats" in failures[0].message
    assert [a[0] for a in answers if isinstance(a, list)] == ["b", "b"]


def test_an_ok_from_the_old_broker_wins_and_the_new_one_is_told_to_cancel() -> None:
    async def scenario() -> tuple[list[Any], list[bytes]]:
        async with fleet() as (client, a, b):
            a.hang()
            b.answering = False
            call = asyncio.create_task(client.infer("m", ["x"]))
            call_b = asyncio.create_task(client.infer("m", ["y"]))
            await until(lambda: not client.brokers[0].live)
            await until(lambda: len(b.requests) == 2)  # its own and the replayed one
            a.resume()  # a answers the request it held before b does
            first = await call
            b.answering = True
            await until(lambda: len(b.cancels) == 1)
            call_b.cancel()
            return first, b.cancels

    first, cancels = asyncio.run(scenario())
    assert first == ["a"] and len(cancels) == 1


def test_stats_of_every_broker_and_their_merged_view() -> None:
    async def scenario() -> Any:
        async with fleet() as (client, a, b):
            await client.infer("m", ["x"])
            merged = await client.stats()
            assert not client._pending  # every exchange let go of its entry
            await a.vanish()
            return merged, await client.stats_by_broker(timeout_ms=300), b.endpoint

    merged, by_broker, live = asyncio.run(scenario())
    assert merged["models"]["m"]["requests"] == {"ok": 1} and len(merged["brokers"]) == 2
    assert isinstance(by_broker.pop(live), dict)
    assert all(isinstance(v, BrokerUnavailable) for v in by_broker.values())


@pytest.mark.parametrize("endpoints", ["", " , "])
def test_a_client_needs_a_broker(endpoints: str) -> None:
    with pytest.raises(ValueError, match="at least one broker"):
        AsyncClient(endpoints)


@pytest.mark.parametrize("status", [Status.NO_WORKER, Status.UNKNOWN_MODEL])
def test_a_broker_without_workers_sends_the_request_to_the_other(status: Status) -> None:
    """No worker there, or none that ever registered the model with it (a broker that just came back, whose
    workers have not registered again): another broker may have them."""
    async def scenario() -> list[str]:
        async with fleet() as (client, a, _):
            a.status = status
            return [(await client.infer("m", ["x"]))[0] for _ in range(4)]

    assert asyncio.run(scenario()) == ["b"] * 4


def test_one_broker_restarting_past_the_liveness_window_loses_nothing_it_held_or_was_sent_meanwhile() -> None:
    """A lone broker killed with requests outstanding, back on its endpoint after twice the liveness window (a
    supervisor's restart delay and a loaded host's start): what it held is sent to the new one, and what was
    sent while it was away waits for it; every request has one answer, from the new broker."""

    async def scenario() -> list[Any]:
        async with connected(("old",), 30_000, restart_wait_ms=25_000) as (client, [old], context):
            old.answering = False
            held = [asyncio.create_task(client.infer("m", [str(i)])) for i in range(3)]
            await until(lambda: len(old.requests) == 3)
            loop = asyncio.get_running_loop()
            await old.vanish()
            gone_at = loop.time()
            await until(lambda: loop.time() >= gone_at + 2 * client.brokers.expiry_s)
            meanwhile = [asyncio.create_task(client.infer("m", ["new"])) for _ in range(2)]
            await until(lambda: loop.time() >= gone_at + 3 * client.brokers.expiry_s)
            restarted = FakeBroker(context, "restarted", old.endpoint)
            try:
                return list(await asyncio.wait_for(asyncio.gather(*held, *meanwhile, return_exceptions=True), 20))
            finally:
                await restarted.vanish()

    assert asyncio.run(scenario()) == [["restarted"]] * 5


def test_one_broker_that_never_comes_back_fails_its_requests_after_the_restart_wait_not_their_timeout() -> None:
    async def scenario() -> tuple[list[Any], float]:
        async with connected(("old",), 30_000, restart_wait_ms=1_000) as (client, [old], _):
            old.answering = False
            held = asyncio.create_task(client.infer("m", ["held"]))
            await until(lambda: len(old.requests) == 1)
            loop = asyncio.get_running_loop()
            await old.vanish()
            gone_at = loop.time()
            await until(lambda: client._dropped_at is not None)
            sent_meanwhile = asyncio.create_task(client.infer("m", ["new"]))
            answers = await asyncio.wait_for(asyncio.gather(held, sent_meanwhile, return_exceptions=True), 20)
            return list(answers), loop.time() - gone_at

    answers, waited_s = asyncio.run(scenario())
    assert all(isinstance(answer, BrokerUnavailable) for answer in answers), answers
    assert waited_s >= 1.0, "both waited the restart wait for the broker"
