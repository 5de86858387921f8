"""Embeddings in float16 (the ``precision`` parameter, issue 41 point 3) through a real broker and real workers serving
the default model: over ZeroMQ with ``zbatch.Client`` the numbers travel as float16 bytes, half a float32 reply's,
and the vectors stay those of float32; over HTTP the Hugging Face route passes the parameter on; a bad precision is
refused with a clear answer while normal traffic runs beside it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.daemons import Daemon, http_json
from worker.runners import DEFAULT_MODEL_NAME
from zbatch import AsyncClient, BadRequest, Client
from zbatch.protocol import payloads
from zbatch.protocol.wire import Status

MODEL = DEFAULT_MODEL_NAME
TEXTS = ["hello world", "Ünïcödé café 東京 and a dog", "a sentence about vectors sent in half the bytes"]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def reply_bytes(broker: Daemon, precision: str) -> int:
    """The size of the reply's payload for TEXTS in ``precision``."""
    async def go() -> int:
        async with AsyncClient(broker.frontend) as client:
            body = {"inputs": TEXTS, "parameters": {"precision": precision}}
            reply = await asyncio.wait_for(client.request(MODEL, payloads.encode_payload(body), items=len(TEXTS),
                                                          timeout_ms=60_000), 120)
        assert reply.status is Status.OK, reply.message
        return len(reply.payload)

    return asyncio.run(go())


def test_float16_vectors_are_the_float32_ones_in_half_the_bytes(stack: dict[str, Daemon]) -> None:
    broker = stack["broker"]
    with Client(broker.frontend) as client:
        single = client.infer(MODEL, TEXTS)
        half = client.infer(MODEL, TEXTS, {"precision": "float16"})
        cut = client.infer(MODEL, TEXTS, {"precision": "float16", "dimensions": 64})
    assert [vector.dtype for vector in single] == [np.dtype(np.float32)] * len(TEXTS)
    assert [vector.dtype for vector in half + cut] == [np.dtype(np.float16)] * 2 * len(TEXTS)
    assert [cosine(a.astype(np.float32), b) >= 0.9999 for a, b in zip(half, single, strict=True)] == [True] * 3
    assert [vector.shape for vector in cut] == [(64,)] * 3
    float32_bytes, float16_bytes = reply_bytes(broker, "float32"), reply_bytes(broker, "float16")
    numbers = len(TEXTS) * single[0].size
    assert float32_bytes - float16_bytes >= numbers * 2  # two bytes fewer for every number


def test_the_huggingface_route_passes_the_precision_on(stack: dict[str, Daemon]) -> None:
    url = f"{stack['gateway'].url}/models/{MODEL}"
    status, _, single = http_json(url, {"inputs": TEXTS})
    assert status == 200
    status, _, half = http_json(url, {"inputs": TEXTS, "parameters": {"precision": "float16"}})
    assert status == 200
    for a, b in zip(half, single, strict=True):
        wide, narrow = np.asarray(b, dtype=np.float32), np.asarray(a, dtype=np.float32)
        assert np.array_equal(narrow, narrow.astype(np.float16).astype(np.float32))  # float16's numbers, exactly
        assert cosine(narrow, wide) >= 0.9999
    status, _, error = http_json(url, {"inputs": TEXTS, "parameters": {"precision": "int4"}})
    assert status == 400 and "'precision' must be one of 'float32', 'float16', not 'int4'" in str(error)


def test_a_bad_precision_is_refused_and_its_neighbours_answered(stack: dict[str, Daemon]) -> None:
    async def go() -> list[object]:
        async with AsyncClient(stack["broker"].frontend) as client:
            calls = [client.infer(MODEL, [text], {"precision": "float8"} if index % 2 else {})
                     for index, text in enumerate(TEXTS * 4)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 120)

    outcomes = asyncio.run(go())
    refused = outcomes[1::2]
    assert all(isinstance(each, BadRequest) and "'precision' must be one of" in str(each) for each in refused)
    answered = outcomes[0::2]
    assert all(isinstance(each, list) and each[0].dtype == np.float32 for each in answered), answered
    with Client(stack["broker"].frontend) as client:
        (unset,) = client.infer(MODEL, TEXTS[:1], {"precision": None})  # nil: the default
        with pytest.raises(BadRequest, match="'precision' must be one of 'float32', 'float16', not 0"):
            client.infer(MODEL, TEXTS[:1], {"precision": 0})
    assert unset.dtype == np.float32
