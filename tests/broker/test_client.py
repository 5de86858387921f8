"""The Python clients against a real broker and real workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from broker.client import AsyncClient, Client, Overloaded, UnknownModel
from tests.daemons import Daemon, running_stack
from worker.models import DEFAULT_MODEL_NAME

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
                return await asyncio.gather(*calls, return_exceptions=True)

        without = asyncio.run(burst(0))
        with_retries = asyncio.run(burst(100))
    assert any(isinstance(r, Overloaded) for r in without)
    assert all(isinstance(r, list) for r in with_retries)
