"""Several models behind one broker: each request reaches only the workers serving its model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.daemons import Daemon, broker_stats, http_json, start_broker, start_gateway, start_worker, wait_until
from tests.worker.tiny_models import make_tiny_bert
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient, UnknownModel

EMBED, CLASSIFY, FILL = DEFAULT_MODEL_NAME, "tiny-classifier", "tiny-fill-mask"


@pytest.fixture(scope="module")
def models_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    """Worker "embedder" serves the default model; worker "tiny" serves two small models at once."""
    log_dir = tmp_path_factory.mktemp("models")
    classifier = make_tiny_bert(tmp_path_factory.mktemp("cls"), head="text-classification")
    fill_mask = make_tiny_bert(tmp_path_factory.mktemp("mlm"), head="fill-mask")
    daemons: dict[str, Daemon] = {}
    try:
        daemons["broker"] = start_broker(log_dir)
        daemons["embedder"] = start_worker(daemons["broker"], log_dir, "embedder", wait=False)
        extra = f"name={FILL},path={fill_mask},task=fill-mask,max_batch_size=4"
        daemons["tiny"] = start_worker(daemons["broker"], log_dir, "tiny", model_path=classifier,
                                       model_name=CLASSIFY, task="text-classification", extra_models=extra)
        wait_until(lambda: len((broker_stats(daemons["broker"].frontend) or {"workers": []})["workers"]) == 2,
                   120, "both workers", daemons["embedder"].log)
        daemons["gateway"] = start_gateway(daemons["broker"], log_dir, models=(EMBED, CLASSIFY, FILL))
        yield daemons
    finally:
        for daemon in reversed(list(daemons.values())):
            daemon.stop()


def batches_by_worker(stack: dict[str, Daemon]) -> dict[str, dict[str, int]]:
    stats = broker_stats(stack["broker"].frontend) or {"workers": []}
    return {w["name"]: {m: c["items"] for m, c in w["batches"].items()} for w in stats["workers"]}


def test_each_model_is_served_only_by_its_workers_and_batches_never_mix(models_stack: dict[str, Daemon]) -> None:
    url = models_stack["gateway"].url

    async def mixed_traffic() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            async def post(model: str, text: str) -> tuple[int, Any]:
                async with session.post(f"{url}/models/{model}", json={"inputs": text}) as r:
                    return r.status, await r.json()
            calls = [post(m, t) for i in range(12)
                     for m, t in ((EMBED, f"text {i}"), (CLASSIFY, f"hello world {i}"), (FILL, "test [MASK]"))]
            return await asyncio.gather(*calls)

    results = asyncio.run(mixed_traffic())
    assert all(status == 200 for status, _ in results)
    embeddings, labels, fills = results[0::3], results[1::3], results[2::3]
    assert all(len(body) == 384 for _, body in embeddings)
    assert all({"label", "score"} <= set(body[0] if isinstance(body, list) else body) for _, body in labels)
    assert all("token_str" in body[0] for _, body in fills)

    def all_counted() -> dict[str, dict[str, int]] | None:
        counts = batches_by_worker(models_stack)
        tiny = counts.get("tiny", {})
        done = counts.get("embedder", {}).get(EMBED, 0) >= 12 and min(tiny.get(FILL, 0), tiny.get(CLASSIFY, 0)) >= 12
        return counts if done else None

    # Each worker's counts reach the broker with its heartbeats: wait for every model's, not only some.
    counts = wait_until(all_counted, 30, "batch counts of all three models from both workers")
    assert set(counts["embedder"]) == {EMBED}
    assert set(counts["tiny"]) == {CLASSIFY, FILL} and counts["tiny"][CLASSIFY] >= 12


def test_models_endpoint_lists_each_model_with_its_workers(models_stack: dict[str, Daemon]) -> None:
    status, _, body = http_json(models_stack["gateway"].url + "/models")
    workers = {m["name"]: sorted(w["name"] for w in m["workers"]) for m in body["models"]}
    assert status == 200 and workers == {EMBED: ["embedder"], CLASSIFY: ["tiny"], FILL: ["tiny"]}
    assert http_json(models_stack["gateway"].url + "/readyz")[0] == 200


def test_unknown_model_is_404_over_http_and_unknown_model_over_zmq(models_stack: dict[str, Daemon]) -> None:
    status, _, body = http_json(models_stack["gateway"].url + "/models/nope", {"inputs": "x"})
    assert (status, body["error"]["code"]) == (404, "unknown_model")

    async def ask() -> None:
        async with AsyncClient(models_stack["broker"].frontend) as client:
            await client.infer("nope", ["x"])

    with pytest.raises(UnknownModel):
        asyncio.run(ask())
