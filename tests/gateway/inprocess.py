"""The real gateway application in this process, in front of a stand-in for the broker client.

For tests of what the gateway does with a request and with the broker's
answer, without a broker: :class:`StubClient` records each call and answers
with outputs and token counts, statistics, or a :mod:`zbatch.client` error
chosen by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig
from zbatch.client import AsyncClient
from zbatch.hub import BUNDLED_MODEL_NAME
from zbatch.protocol import payloads
from zbatch.protocol.wire import Reply, Status

CONFIG = GatewayConfig(default_model=BUNDLED_MODEL_NAME)  # two models are served: the default is named
# A model's figures in STATS, as a broker gives them: workers, and what READY said (PROTOCOL.md 3.6).
Figures = dict[str, Any]
AnswerFunction = Callable[[list[Any], dict[str, Any], str], tuple[list[Any], list[int] | None]]


def vectors(inputs: list[Any], parameters: dict[str, Any], operation: str) -> tuple[list[Any], list[int] | None]:
    """One short float32 vector per text (a score per pair, tokens to tokenize), and a token count per input
    (its words and two special tokens)."""
    tokens = [len(str(item).split()) + 2 for item in inputs]
    if operation == "tokenize":
        return [[{"id": 2, "text": "[CLS]", "special": True, "start": None, "stop": None}] for _ in inputs], tokens
    if operation == "embed_all":
        return [np.full((count, 2), 0.5, dtype=np.float32) for count in tokens], tokens
    if operation == "decode":
        return [" ".join(map(str, ids.tolist())) for ids in inputs], [len(ids) for ids in inputs]
    if inputs and isinstance(inputs[0], list):
        return [0.5 + index / 100 for index in range(len(inputs))], tokens
    return [np.array([0.5, 0.25], dtype=np.float32) for _ in inputs], tokens


@dataclass
class StubClient:
    """Answers requests with ``answer`` (by default one short vector per input) and ``stats`` with ``models``.

    By default the broker knows the default model and "m", each with one worker and no details.
    """

    error: Exception | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    answer: AnswerFunction = vectors
    models: dict[str, Figures] = field(default_factory=lambda: {CONFIG.default_model: {"workers": 1},
                                                                "m": {"workers": 1}})

    async def request(self, model: str, payload: bytes, *, items: int, **options: Any) -> Reply:
        body = payloads.decode_payload(payload)
        self.calls.append({"model": model, "texts": body["inputs"], "parameters": body["parameters"],
                           "operation": body.get("operation", "run"), **options})
        if self.error is not None:
            raise self.error
        outputs, tokens = self.answer(body["inputs"], body["parameters"], body.get("operation", "run"))
        answer: dict[str, Any] = {"outputs": outputs} | ({} if tokens is None else {"tokens": tokens})
        return Reply(b"", Status.OK, "", payload=payloads.encode_payload(answer))

    async def stats(self, **options: Any) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        served = [name for name, figures in self.models.items() if figures.get("workers")]
        worker = {"identity": "00aa", "name": "w1", "models": served, "capacity": 8}
        return {"draining": False, "models": self.models, "workers": [worker] if served else []}

    async def stats_by_broker(self, **options: Any) -> dict[str, Any]:
        try:
            return {CONFIG.frontend: await self.stats(**options)}
        except Exception as exc:  # as AsyncClient gives it: the error in place of the statistics
            return {CONFIG.frontend: exc}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


def call(
    stub: StubClient, method: str, path: str, *, body: bytes = b"", headers: Mapping[str, str] | None = None,
    config: GatewayConfig = CONFIG,
) -> Answer:
    """One request to a fresh gateway application with ``config`` whose broker client is ``stub``."""

    async def exchange() -> Answer:
        app = create_app(config, cast(AsyncClient, stub))
        async with TestClient(TestServer(app)) as client:
            response = await client.request(method, path, data=body, headers=dict(headers or {}))
            is_json = response.content_type == "application/json"
            answer = await response.json() if is_json else await response.text()
            return Answer(response.status, dict(response.headers), answer)

    return asyncio.run(exchange())


def sparse(inputs: list[Any], parameters: dict[str, Any], operation: str) -> tuple[list[Any], list[int] | None]:
    """A sparse-embeddings model's answer: per input, two vocabulary entries and their weights."""
    entries = {"indices": np.array([3, 17], dtype=np.int32), "values": np.array([0.5, 1.25], dtype=np.float32)}
    return [entries for _ in inputs], [len(str(item).split()) + 2 for item in inputs]
