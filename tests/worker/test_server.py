"""The worker's reading of a request's payload, and a hostile one against real daemons; the shell's bookkeeping
of what it prepared."""

from __future__ import annotations

import asyncio

import pytest

from tests.daemons import Daemon, broker_stats
from worker.requests import BadPayload, InputLimits, decode_request
from worker.runners import DEFAULT_MODEL_NAME
from worker.server import answered_early
from zbatch.client import AsyncClient
from zbatch.protocol import payloads
from zbatch.protocol.wire import Request, Status


def request(body: object, items: int = 1) -> Request:
    return Request(b"job", DEFAULT_MODEL_NAME, items, payloads.encode_payload(body))


def parse(job: Request) -> tuple[list[object], dict[str, object]]:
    decoded = decode_request(job.payload, job.items, InputLimits())
    return decoded.inputs, decoded.parameters


def test_parse_payload_takes_inputs_and_parameters() -> None:
    assert parse(request({"inputs": ["a", "b"], "parameters": {"normalize": False}}, 2)) == (
        ["a", "b"], {"normalize": False})
    assert parse(request({"inputs": ["a"]})) == (["a"], {})


@pytest.mark.parametrize(("body", "problem"), [
    ({"inputs": "a"}, "a list of 'inputs'"),
    ({"inputs": ["a"], "parameters": [1]}, "'parameters' must be a map"),
    ({"inputs": ["a"], "parameters": {b"normalize": True}}, "parameter names must be strings"),
    ({"inputs": ["a"], "parameters": {1: True, "normalize": True}}, "parameter names must be strings"),
    ({"inputs": ["a", "b"]}, "items says 1"),
])
def test_parse_payload_refuses_what_it_cannot_use(body: object, problem: str) -> None:
    with pytest.raises(BadPayload, match=problem):
        parse(request(body))


def test_parameter_names_of_mixed_types_are_refused_and_the_workers_keep_serving(stack: dict[str, Daemon]) -> None:
    """A client over ZeroMQ can send any map keys (JSON cannot); names that do not sort together must be
    refused before they reach the batch key, which sorts them in the broker link's message handler."""
    hostile = payloads.encode_payload({"inputs": ["x"], "parameters": {b"a": 1, "b": 2}})

    async def ask() -> tuple[Status, str, list[object]]:
        async with AsyncClient(stack["broker"].frontend) as client:
            reply = await client.request(DEFAULT_MODEL_NAME, hostile, items=1)
            fine = await client.infer(DEFAULT_MODEL_NAME, ["still served"])
        return reply.status, reply.message, fine

    status, message, fine = asyncio.run(ask())
    assert status is Status.BAD_REQUEST and "parameter names must be strings" in message
    assert len(fine) == 1
    stats = broker_stats(stack["broker"].frontend)
    assert stats is not None and sorted(w["name"] for w in stats["workers"]) == ["w1", "w2"]
    assert stack["w1"].alive() and stack["w2"].alive()


def test_prepared_requests_answered_early_are_found_once_more_are_prepared_than_held() -> None:
    held = {b"a", b"b"}
    prepared = dict.fromkeys([b"a", b"b"])
    assert answered_early(prepared, len(held), held.__contains__) == []  # each prepared request is held
    prepared[b"gone"] = None  # answered (cancelled, expired) before its last item reached the engine
    assert answered_early(prepared, len(held), held.__contains__) == [b"gone"]
    held.add(b"c")  # held and not prepared: a stale entry waits for the next look, bounded by what is held
    assert answered_early(prepared, len(held), held.__contains__) == []
