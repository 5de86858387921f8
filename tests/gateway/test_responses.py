"""Turning worker outputs and broker stats into JSON, without any process."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from broker.core import BrokerCore, CoreSettings
from gateway.catalog import worker_count
from gateway.config import GatewayConfig
from gateway.dialects.zbatch import models_listing
from gateway.responses import jsonable
from zbatch.protocol import wire


def real_stats() -> dict[str, Any]:
    """Statistics from a real broker core with one worker for "echo" and none for "idle"."""
    core = BrokerCore(CoreSettings(models=("echo", "idle")), clock=lambda: 0.0)
    ready = wire.Ready((wire.ModelInfo("echo", "embeddings", 8),), 8, name="w1")
    core.worker_message(b"W1", wire.encode_ready(ready))
    return core.stats()


STATS = real_stats()


def test_jsonable_turns_numpy_and_bytes_into_plain_json() -> None:
    value = {
        "vector": np.arange(3, dtype=np.float32),
        "nested": [
            {"scores": np.array([[1, 2]], dtype=np.int64)},
            (np.float32(0.5), np.bool_(True)),
        ],
        b"\x00\xff": b"\x01",
        7: "key made text",
    }
    converted = jsonable(value)
    assert converted == {
        "vector": [0.0, 1.0, 2.0],
        "nested": [{"scores": [[1, 2]]}, [0.5, True]],
        "00ff": "01",
        "7": "key made text",
    }
    assert json.loads(json.dumps(converted)) == converted


def test_float32_vectors_become_python_floats() -> None:
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    converted = jsonable(vector)
    assert len(converted) == 384 and all(type(x) is float for x in converted)
    assert np.array_equal(np.asarray(converted, dtype=np.float32), vector)


def test_worker_count_reads_the_models_figures() -> None:
    assert [worker_count(STATS, m) for m in ("echo", "idle", "unknown")] == [1, 0, 0]
    assert worker_count({}, "echo") == 0


def test_models_listing_groups_workers_by_model() -> None:
    listing = models_listing(STATS, GatewayConfig(tei_model="echo", tei_rerank_model="other",
                                                  tei_predict_model="other"))["models"]
    assert [m["name"] for m in listing] == ["echo", "idle"]
    assert [w["name"] for w in listing[0]["workers"]] == ["w1"]
    assert listing[0]["task"] == "embeddings"
    assert listing[0]["dialects"] == {  # echo, the one model a worker serves, is the default model it follows
        "zbatch": ["POST /"],
        "huggingface": ["POST /models/echo", "POST /models/echo (sentence-similarity)"],
        "kserve": ["POST /v2/models/echo/infer"], "openai": ["POST /v1/embeddings"],
        "tei": ["POST /embed", "POST /embed_all", "POST /similarity", "POST /tokenize", "POST /decode", "GET /info",
                "GET /health", "POST /"]}
    assert listing[1] == {"name": "idle", "task": None, "workers": [], "stats": STATS["models"]["idle"],
                          "dialects": {"huggingface": ["POST /models/idle"],
                                       "kserve": ["POST /v2/models/idle/infer"]}}
