"""Triton's model configuration of each task (gateway/model_config.py), and ``GET /v2/models/{model}/config``."""

from __future__ import annotations

import pytest

from gateway.catalog import ModelInfo
from gateway.model_config import model_config
from gateway.signatures import signature
from tests.gateway.inprocess import StubClient, call
from zbatch.protocol import vocabulary as v

STRING_PER_INPUT = {"data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}


def test_an_embeddings_model_is_batched_up_to_the_request_limit() -> None:
    config = model_config(ModelInfo("e", 1, v.EMBEDDINGS, max_batch_size=32, dimensions=384), 256)
    assert config == {"name": "e", "platform": "zbatch/embeddings", "backend": "zbatch", "max_batch_size": 256,
                      "input": [{"name": "text", **STRING_PER_INPUT}],
                      "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}],
                      "dynamic_batching": {"preferred_batch_size": [32]}}


def test_rerank_and_classification_inputs_and_outputs() -> None:
    rerank = model_config(ModelInfo("r", 1, v.RERANK, max_batch_size=64), 16)
    assert rerank["input"] == [{"name": "query", **STRING_PER_INPUT}, {"name": "texts", **STRING_PER_INPUT}]
    assert rerank["output"] == [{"name": "scores", "data_type": "TYPE_FP32", "dims": [1], "reshape": {"shape": []}}]
    assert rerank["dynamic_batching"] == {"preferred_batch_size": [16]}  # never above what a request carries
    classify = model_config(ModelInfo("c", 1, v.TEXT_CLASSIFICATION), 8)
    assert classify["input"][1] == {"name": "text_pair", **STRING_PER_INPUT, "optional": True}
    assert classify["output"][0] == {"name": "labels", "data_type": "TYPE_STRING", "dims": [-1]}
    assert "dynamic_batching" not in classify  # the workers' batch size is not known yet


@pytest.mark.parametrize("task", [v.SPARSE_EMBEDDINGS, v.OBJECT_DETECTION])
def test_flat_outputs_have_no_batch_dimension(task: str) -> None:
    info = ModelInfo("f", 1, task, max_batch_size=8)
    config = model_config(info, 256)
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert [(t["name"], t["dims"]) for t in config["output"]] == [(n, s) for n, _, s in signature(info).outputs]


def test_the_http_route_answers_it_and_refuses_an_unknown_model() -> None:
    stub = StubClient(models={"e": {"workers": 1, "info": {"task": v.EMBEDDINGS, "dimensions": 3}}})
    answer = call(stub, "GET", "/v2/models/e/config")
    assert answer.status == 200 and answer.body["output"][0]["dims"] == [3], answer
    unknown = call(stub, "GET", "/v2/models/none/config")
    assert unknown.status == 404 and set(unknown.body) == {"error"}
