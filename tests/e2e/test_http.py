"""The whole stack end to end: real broker, two real workers with the default model, real gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.daemons import Daemon, http_json, start_broker, start_gateway, start_worker, wait_until
from worker.runners import DEFAULT_MODEL_NAME, default_model_path

MODEL = DEFAULT_MODEL_NAME
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Batching requests raises throughput on a GPU.",
    "ZeroMQ sockets carry multipart messages.",
    "hello world",
]


@pytest.fixture(scope="module")
def reference_embeddings() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(default_model_path(), device="cpu")
    return np.asarray(model.encode(TEXTS, normalize_embeddings=True))


def test_embeddings_match_sentence_transformers(stack: dict[str, Daemon], reference_embeddings: np.ndarray) -> None:
    status, _, body = http_json(f"{stack['gateway'].url}/models/{MODEL}", {"inputs": TEXTS})
    assert status == 200
    got = np.asarray(body, dtype=np.float32)
    assert got.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(got, reference_embeddings, atol=1e-5)
    status, _, single = http_json(f"{stack['gateway'].url}/models/{MODEL}", {"inputs": TEXTS[0]})
    assert status == 200 and len(single) == 384
    np.testing.assert_allclose(single, reference_embeddings[0], atol=1e-5)


def test_plain_text_post_to_root_like_the_seed_curl(stack: dict[str, Daemon], reference_embeddings: np.ndarray) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what curl -d sends
    status, _, body = http_json(stack["gateway"].url + "/", data=b"hello world", headers=form)
    assert status == 200
    np.testing.assert_allclose(body, reference_embeddings[3], atol=1e-5)
    status, _, body = http_json(stack["gateway"].url + "/", data=b"hello world", headers={"Content-Type": "text/plain"})
    assert status == 200 and len(body) == 384


def test_openai_compatible_embeddings(stack: dict[str, Daemon], reference_embeddings: np.ndarray) -> None:
    status, _, body = http_json(f"{stack['gateway'].url}/v1/embeddings", {"model": MODEL, "input": TEXTS[:2]})
    assert status == 200
    assert body["object"] == "list" and body["model"] == MODEL and "usage" in body
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" for d in body["data"])
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], reference_embeddings[:2], atol=1e-5)


def test_64_concurrent_requests_succeed_and_are_batched(stack: dict[str, Daemon]) -> None:
    url = f"{stack['gateway'].url}/models/{MODEL}"

    def counts() -> tuple[int, int]:
        """The model's batches and batched items so far (the stack is the module's: earlier tests ran some)."""
        model = http_json(f"{stack['gateway'].url}/v1/stats")[2]["models"][MODEL]
        return model["batches"], model["batched_items"]

    batches_before, items_before = counts()

    async def fire() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> int:
                async with session.post(url, json={"inputs": f"concurrent request {i} " * (1 + i % 7)}) as r:
                    body = await r.json()
                    assert len(body) == 384
                    return r.status
            return await asyncio.gather(*(one(i) for i in range(64)))

    assert asyncio.run(fire()) == [200] * 64

    def batched() -> bool:
        """All 64 counted (workers report in heartbeats), in fewer batches than requests."""
        batches, items = counts()
        return items - items_before >= 64 and items - items_before > batches - batches_before

    wait_until(batched, 10, "/v1/stats to count the 64 in batches above one item", stack["broker"].log)


def test_health_readiness_and_models(stack: dict[str, Daemon]) -> None:
    url = stack["gateway"].url
    assert http_json(url + "/healthz")[0] == 200
    assert http_json(url + "/readyz")[0] == 200
    status, _, models = http_json(url + "/models")
    assert status == 200 and MODEL in str(models) and "w1" in str(models) and "w2" in str(models)


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "code"),
    [
        (f"/models/{MODEL}", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
         "bad_request"),
        (f"/models/{MODEL}", {"body": {"inputs": 42}}, 400, "bad_request"),
        (f"/models/{MODEL}", {"body": {"inputs": []}}, 400, "bad_request"),
        (f"/models/{MODEL}", {"body": {"inputs": [1, 2]}}, 400, "bad_request"),
        (f"/models/{MODEL}", {"body": {"nothing": "here"}}, 400, "bad_request"),
        (f"/models/{MODEL}", {"body": {"inputs": "x", "parameters": {"bogus": 1}}}, 400, "bad_request"),
        (f"/models/{MODEL}", {"body": {"inputs": "x"}, "headers": {"X-Request-Timeout-Ms": "soon"}}, 400,
         "bad_request"),
        ("/models/no-such-model", {"body": {"inputs": "x"}}, 404, "unknown_model"),
        (f"/models/{MODEL}", {"data": b"x" * (2 * 1024 * 1024), "headers": {"Content-Type": "application/json"}},
         413, "payload_too_large"),
        (f"/models/{MODEL}", {"data": b"<xml/>", "headers": {"Content-Type": "application/xml"}}, 415,
         "unsupported_media_type"),
        ("/models/reserved-model", {"body": {"inputs": "x"}, "headers": {"X-Request-Timeout-Ms": "100"}}, 504,
         "deadline_exceeded"),
        ("/models/reserved-model", {"body": {"inputs": "x"}}, 503, "no_worker"),
    ],
)
def test_bad_inputs_get_their_documented_status(
    stack: dict[str, Daemon], path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    got, _, body = http_json(stack["gateway"].url + path, **kwargs)
    assert (got, body["error"]["code"]) == (status, code), body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]


def test_a_failing_model_input_is_a_502_without_internals(failing_stack: Daemon) -> None:
    url = f"{failing_stack.url}/models/tiny-fill-mask"
    status, _, body = http_json(url, {"inputs": "test [MASK]"})
    assert status == 200 and isinstance(body, list)
    status, _, body = http_json(url, {"inputs": ["test [MASK]", "hello " * 300 + "[MASK]"]})
    assert status == 502 and body["error"]["code"] == "worker_error"  # the worker's failure, not the gateway's
    assert "Traceback" not in body["error"]["message"] and "/" not in body["error"]["message"]
    status, _, body = http_json(url, {"inputs": "hello world"})
    assert status == 400 and body["error"]["code"] == "bad_request"


@pytest.fixture(scope="module")
def failing_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A fill-mask model with 128 positions and no truncation: a long input makes it raise."""
    from tests.worker.tiny_models import make_tiny_bert

    log_dir = tmp_path_factory.mktemp("failing")
    model_path = make_tiny_bert(tmp_path_factory.mktemp("tiny"), head="fill-mask")
    broker = start_broker(log_dir)
    daemons = [broker]
    try:
        daemons.append(start_worker(broker, log_dir, "tiny", model_path=model_path, model_name="tiny-fill-mask",
                                    task="fill-mask"))
        gateway = start_gateway(broker, log_dir, models=("tiny-fill-mask",))
        daemons.append(gateway)
        yield gateway
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def test_burst_above_a_small_backlog_is_shed_with_retry_after_and_all_answered(log_dir: Path) -> None:
    broker = start_broker(log_dir, max_backlog=8)
    daemons = [broker]
    try:
        daemons.append(start_worker(broker, log_dir, "only", capacity=2, max_batch_size=2))
        gateway = start_gateway(broker, log_dir)
        daemons.append(gateway)
        url = f"{gateway.url}/models/{MODEL}"

        async def burst() -> list[tuple[int, str | None]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                async def one(i: int) -> tuple[int, str | None]:
                    async with session.post(url, json={"inputs": f"burst {i} " * 30}) as r:
                        await r.read()
                        return r.status, r.headers.get("Retry-After")
                return await asyncio.gather(*(one(i) for i in range(200)))

        results = asyncio.run(burst())
        assert len(results) == 200
        statuses = {status for status, _ in results}
        assert statuses <= {200, 503} and 200 in statuses and 503 in statuses
        assert all(retry is not None and int(retry) >= 1 for status, retry in results if status == 503)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
