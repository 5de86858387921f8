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
    assert all(isinstance(r, list) for r in with_retries)


def test_an_overloaded_model_is_refused_here_while_one_request_asks_the_broker(log_dir: Path) -> None:
    """The worker is paused (SIGSTOP), so the backlog stays full until SIGCONT."""
    slow_heartbeats = {"heartbeat_ms": 2000, "heartbeat_liveness": 10}
    worker = {"capacity": 1, "max_batch_size": 1} | slow_heartbeats
    broker = {"max_backlog": 2} | slow_heartbeats
    with running_stack(log_dir, workers=1, broker=broker, worker=worker, gateway=False) as stack:
        frontend = stack["broker"].frontend

        def refused_by_broker() -> int:
            stats = broker_stats(frontend) or {"models": {}}
            return int(stats["models"].get(MODEL, {}).get("requests", {}).get("overloaded", 0))

        async def scenario() -> tuple[list[object], list[object], int, list[object]]:
            async with AsyncClient(frontend) as client:
                stack["w1"].signal(signal.SIGSTOP)
                try:
                    held = [asyncio.create_task(client.infer(MODEL, [f"held {i}"])) for i in range(3)]
                    def backlog() -> dict[str, Any]:
                        stats = broker_stats(frontend) or {"models": {}}
                        return dict(stats["models"].get(MODEL, {}))

                    await asyncio.to_thread(wait_until, lambda: backlog().get("backlog_items") == 2, 30,
                                            "one request on the paused worker and two waiting")
                    first = await asyncio.gather(client.infer(MODEL, ["opens"]), return_exceptions=True)
                    # The broker is paused too, so the probe's answer cannot come back before "local" is
                    # issued (on a busy machine it otherwise can, and then "local" is rightly a new probe).
                    stack["broker"].signal(signal.SIGSTOP)
                    try:
                        probe = asyncio.create_task(client.infer(MODEL, ["probe"]))
                        local = await asyncio.gather(client.infer(MODEL, ["local"]), return_exceptions=True)
                    finally:
                        stack["broker"].signal(signal.SIGCONT)
                    pair: list[object] = [*await asyncio.gather(probe, return_exceptions=True), *local]
                    refusals = await asyncio.to_thread(refused_by_broker)
                finally:
                    stack["w1"].signal(signal.SIGCONT)
                held_results: list[object] = list(await asyncio.gather(*held))
                # The breaker is open: this one probes, gets in, and closes it for those that follow.
                after: list[object] = [await client.infer(MODEL, ["after the pause"])]
                after += await asyncio.gather(*(client.infer(MODEL, [f"after {i}"]) for i in range(3)),
                                              return_exceptions=True)
            return [*first, *pair], held_results, refusals, after

        refused, held, broker_refusals, after = asyncio.run(scenario())
    assert all(isinstance(r, Overloaded) for r in refused)
    assert broker_refusals == 2  # "opens" and the probe; "local" never reached the broker
    assert "moments ago" in str(refused[2])
    assert all(isinstance(r, list) for r in [*held, *after])
