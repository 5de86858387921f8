"""The real gateway application in this process, in front of a stand-in for the broker client.

For tests of what the gateway does with a request and with the broker's
answer, without a broker: :class:`StubClient` records each call and answers
with outputs, statistics, or a :mod:`zbatch.client` error chosen by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig
from zbatch.client import AsyncClient

CONFIG = GatewayConfig()


@dataclass
class StubClient:
    """Answers ``infer`` with one short vector per text and ``stats`` with one worker for the default model."""

    error: Exception | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def infer(self, model: str, texts: list[str], parameters: dict[str, Any], **options: Any) -> list[Any]:
        self.calls.append({"model": model, "texts": texts, "parameters": parameters, **options})
        if self.error is not None:
            raise self.error
        return [[0.5, 0.25] for _ in texts]

    async def stats(self, **options: Any) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {"draining": False, "models": {CONFIG.default_model: {"workers": 1}}, "workers": []}

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
    stub: StubClient, method: str, path: str, *, body: bytes = b"", headers: Mapping[str, str] | None = None
) -> Answer:
    """One request to a fresh gateway application whose broker client is ``stub``."""

    async def exchange() -> Answer:
        app = create_app(CONFIG, cast(AsyncClient, stub))
        async with TestClient(TestServer(app)) as client:
            response = await client.request(method, path, data=body, headers=dict(headers or {}))
            is_json = response.content_type == "application/json"
            answer = await response.json() if is_json else await response.text()
            return Answer(response.status, dict(response.headers), answer)

    return asyncio.run(exchange())
