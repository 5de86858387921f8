"""The Python clients against a real broker and real workers."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemons import Daemon, broker_stats, running_stack, wait_until
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient, Client, Overloaded, UnknownModel

MODEL = DEFAULT_MODEL_NAME


def test_blocking_client_pipelines_and_decodes_to_numpy(stack: dict[str, Daemon]) -> None:
    with Client(stack["broker"].frontend) as client:
        futures = [client.submit(MODEL, [f"pipelined {i}", "second"]) for i in range(32)]
        results = [future.result(timeout=60) for future in futures]
        single = client.infer(MODEL, ["pipelined 5", "second"])
        assert client.stats()["models"][MODEL]["workers"] == 2
    assert all(len(r) == 2 and r[0].dtype == np.float32 and r[0].shape == (384,) for r in results)
    np.testing.assert_allclose(results[5][0], single[0], atol=1e-5)


def test_blocking_client_raises_typed_errors(stack: dict[str, Daemon]) -> None:
    with Client(stack["broker"].frontend) as client, pytest.raises(UnknownModel):
        client.infer("no-such-model", ["x"])


def test_overload_is_retried_with_backoff_when_asked(log_dir: Path) -> None:
    settings = {"capacity": 1, "max_batch_size": 1}
    with running_stack(log_dir, workers=1, broker={"max_backlog": 2}, worker=settings, gateway=False) as stack:
        async def burst(retries: int) -> list[object]:
            async with AsyncClient(stack["broker"].frontend, overload_retries=retries) as client:
                calls = (client.infer(MODEL, [f"retry {i}"]) for i in range(12))
                return list(await asyncio.gather(*calls, return_exceptions=True))

        without = asyncio.run(burst(0))
        with_retries = asyncio.run(burst(100))
    assert any(isinstance(r, Overloaded) for r in without)
    assert all(isinstance(r, list) for r in with_retries), with_retries


def test_the_breaker_refuses_here_only_what_the_broker_would_refuse(log_dir: Path) -> None:
    """The worker is paused (SIGSTOP), so what the broker holds stays put until SIGCONT; a memory bound of 4
    items, and no measured rate (the worker has run nothing), make the broker's verdicts exact: 1,000 ms.  A
    liveness window of 30 s keeps the paused worker registered however slowly a busy host runs the scenario."""
    worker = {"capacity": 1, "max_batch_size": 1}
    broker = {"max_backlog": 4, "heartbeat_liveness": 30}
    with running_stack(log_dir, workers=1, broker=broker, worker=worker, gateway=False) as stack:
        frontend = stack["broker"].frontend

        def refused_by_broker() -> int:
            stats = broker_stats(frontend) or {"models": {}}
            return int(stats["models"].get(MODEL, {}).get("requests", {}).get("overloaded", 0))

        async def scenario() -> tuple[list[object], list[object], int]:
            async with AsyncClient(frontend) as client:
                stack["w1"].signal(signal.SIGSTOP)
                try:
                    held = [asyncio.create_task(client.infer(MODEL, [f"held {i}"])) for i in range(3)]

                    def backlog() -> dict[str, Any]:
                        stats = broker_stats(frontend) or {"models": {}}
                        return dict(stats["models"].get(MODEL, {}))

                    await asyncio.to_thread(wait_until, lambda: backlog().get("backlog_items") == 2, 30,
                                            "one request on the paused worker and two waiting")
                    big = ["big"] * 3  # 2 waiting + 3 > 4: the broker refuses it
                    refused: list[object] = [*await asyncio.gather(client.infer(MODEL, big), return_exceptions=True)]
                    small = asyncio.create_task(client.infer(MODEL, ["small"]))  # 2 + 1 <= 4: admitted
                    again = await asyncio.gather(client.infer(MODEL, big), return_exceptions=True)  # refused here
                    refused += [*again]
                    refusals = await asyncio.to_thread(refused_by_broker)
                finally:
                    stack["w1"].signal(signal.SIGCONT)
                answered: list[object] = list(await asyncio.gather(*held, small))
            return refused, answered, refusals

        refused, answered, broker_refusals = asyncio.run(scenario())
    first, second = refused
    assert isinstance(first, Overloaded) and isinstance(second, Overloaded)
    assert broker_refusals == 1  # the second big request never reached the broker
    assert "moments ago" in str(second) and 0 < (second.retry_after_ms or 0) <= 1_000
    assert all(isinstance(r, list) for r in answered)  # the small request got in behind the refused big one
