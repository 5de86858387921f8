"""With API keys on, the broker's view of its workers (routing ids, hosts, pids) is behind a key on every
route the gateway has, today's and any added later: the routes are read from the application itself."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig
from zbatch.client import AsyncClient
from zbatch.protocol import payloads
from zbatch.protocol.wire import Reply, Status

KEY = "scope-test-key-0123456789"
OPEN_WITHOUT_A_KEY = {"/healthz", "/metrics"}  # liveness, and the gateway's own counters for Prometheus
SECRETS = ("secret-host-42", "7365637265742d7730", "4242421")  # a host, a routing id (hex), a pid


class Broker:
    """A stand-in broker client whose statistics name a worker by routing id, host and pid."""

    async def stats(self, **options: Any) -> dict[str, Any]:
        worker = {"identity": SECRETS[1], "name": "w0", "host": SECRETS[0], "pid": int(SECRETS[2]),
                  "device": "cpu", "models": ["m"], "capacity": 8, "free_credit": 8, "in_flight": 0,
                  "in_flight_items": 0, "draining": False, "last_seen_s": 0.1, "batches": {}}
        return {"draining": False, "uptime_s": 1.0, "limits": {}, "workers": [worker],
                "models": {"m": {"workers": 1, "backlog_items": 0}}}

    async def stats_by_broker(self, **options: Any) -> dict[str, Any]:
        return {"tcp://127.0.0.1:5555": await self.stats()}

    async def request(self, model: str, payload: bytes, *, items: int, **options: Any) -> Reply:
        outputs = {"outputs": [np.array([0.5], dtype=np.float32)] * items, "tokens": [3] * items}
        return Reply(b"", Status.OK, payload=payloads.encode_payload(outputs))


def test_no_route_shows_workers_without_a_key(tmp_path: Path) -> None:
    keys_file = tmp_path / "api-keys"
    keys_file.write_text(KEY + "\n")
    app = create_app(GatewayConfig(api_keys_file=str(keys_file)), cast(AsyncClient, Broker()))
    routes = sorted({(route.method, re.sub(r"\{[^}]*\}", "m", route.resource.canonical))
                     for route in app.router.routes() if route.resource is not None})
    assert ("GET", "/v1/stats") in routes and ("GET", "/models") in routes

    async def exchange() -> list[tuple[str, str, int, str, int, str]]:
        answers = []
        async with TestClient(TestServer(app)) as client:
            for method, path in routes:
                bare = await client.request(method, path, json={"inputs": "x", "model": "m", "input": "x"})
                keyed = await client.request(method, path, json={"inputs": "x", "model": "m", "input": "x"},
                                             headers={"Authorization": f"Bearer {KEY}"})
                answers.append((method, path, bare.status, await bare.text(), keyed.status, await keyed.text()))
        return answers

    for method, path, status, body, keyed_status, keyed_body in asyncio.run(exchange()):
        if path in OPEN_WITHOUT_A_KEY:
            assert status == 200, (method, path, status)
            assert not any(secret in body for secret in SECRETS), (method, path, body)
        else:
            assert status == 401, (method, path, status, body)
            assert keyed_status != 401, (method, path, keyed_status, keyed_body)
        if path in ("/models", "/v1/stats") and method == "GET":  # the key does open them, secrets and all
            assert all(secret in keyed_body for secret in SECRETS), (path, keyed_body)
