"""Hostile payloads from a direct ZeroMQ client against the real stack, with normal HTTP traffic flowing.

Every hostile request gets exactly one answer, normal traffic stays 100 %
answered, and no worker dies, wedges or goes silent (the broker would remove
a silent one: its removal counters must not move).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemons import Daemon, broker_stats
from tests.load import Load
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient
from zbatch.protocol.wire import Status

MODEL = DEFAULT_MODEL_NAME
FIFTEEN_MIB = 15 << 20
EMPTY_ARRAYS = b"\x81\xa6inputs\xdd" + FIFTEEN_MIB.to_bytes(4, "big") + b"\x90" * FIFTEEN_MIB
HUGE_TEXT = msgpack.packb({"inputs": ["x" * FIFTEEN_MIB]})
MIXED_KEYS = msgpack.packb({"inputs": ["x"], "parameters": {1: 1, "a": 2}})
CONNECT_WAIT_MS = 30_000


def send_raw(frontend: str, payloads: list[tuple[bytes, int]]) -> list[tuple[Status, str]]:
    """Each payload as one REQUEST for the default model; the status and message of each answer."""

    async def go() -> list[tuple[Status, str]]:
        # A new client each example, connecting while the broker may still be busy with the last one's 15 MiB:
        # the claim is about the answers, so it waits for its connection as long as the harness waits for a start.
        async with AsyncClient(frontend, fail_fast_overload=False, connect_timeout_ms=CONNECT_WAIT_MS) as client:
            replies = await asyncio.gather(*(client.request(MODEL, payload, items=items)
                                             for payload, items in payloads))
        return [(reply.status, reply.message) for reply in replies]

    return asyncio.run(go())


def normal_answer(frontend: str) -> list[Any]:
    async def go() -> list[Any]:
        async with AsyncClient(frontend) as client:
            return await client.infer(MODEL, ["a normal request after the hostile ones"])

    return asyncio.run(go())


def removals(stack: dict[str, Daemon]) -> dict[str, int]:
    """Workers the broker removed so far, by reason: a stalled worker goes silent and is removed."""
    stats = broker_stats(stack["broker"].frontend)
    assert stats is not None
    return dict(stats["worker_removals"])


def assert_workers_unharmed(stack: dict[str, Daemon], removals_before: dict[str, int]) -> None:
    stats = broker_stats(stack["broker"].frontend)
    assert stats is not None and sorted(w["name"] for w in stats["workers"]) == ["w1", "w2"]
    assert stack["w1"].alive() and stack["w2"].alive()
    assert removals(stack) == removals_before


def test_payload_bombs_are_refused_by_limit_while_normal_traffic_flows(stack: dict[str, Daemon]) -> None:
    """15 MiB of empty arrays and a 15 MiB text: each refused with the limit it broke, at once."""
    before = removals(stack)
    with Load(stack["gateway"].url + f"/models/{MODEL}", concurrency=4) as load:
        answers = send_raw(stack["broker"].frontend, [(EMPTY_ARRAYS, 1), (HUGE_TEXT, 1),
                                                      (MIXED_KEYS, 1)] * 3)
        load.stop()
        summary = load.summary()
    assert [status for status, _ in answers] == [Status.BAD_REQUEST] * 9
    assert "max_body_bytes" in answers[0][1] and "max_body_bytes" in answers[1][1]
    assert "parameter names must be strings" in answers[2][1]
    assert summary["sent"] == summary["answered"] == summary["ok"] > 0, summary
    assert normal_answer(stack["broker"].frontend)
    assert_workers_unharmed(stack, before)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8) | st.integers(0, 9), inner,
                                                                max_size=6),
    max_leaves=25)
hostile_payloads = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(st.sampled_from(["inputs", "parameters", "x"]), msgpack_values, max_size=3).map(
        lambda body: msgpack.packb(body, use_bin_type=True)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(hostile_payloads, st.integers(1, 4)), min_size=1, max_size=5))
def test_any_payload_gets_exactly_one_answer_and_the_worker_serves_on(stack: dict[str, Daemon],
                                                                      batch: list[tuple[bytes, int]]) -> None:
    answers = send_raw(stack["broker"].frontend, batch)
    assert len(answers) == len(batch)
    assert {status for status, _ in answers} <= {Status.OK, Status.BAD_REQUEST, Status.WORKER_ERROR}
    assert normal_answer(stack["broker"].frontend)
    assert stack["w1"].alive() and stack["w2"].alive()
