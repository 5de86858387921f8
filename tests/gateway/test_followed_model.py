"""The gateway's default model follows what the brokers serve where its settings name none (gateway/catalog.py):
POST /, TEI's routes, /readyz and the models listing, with one model served, several, none, and no broker.

In this process, the real application in front of a stand-in broker client (tests/gateway/inprocess.py).
"""

from __future__ import annotations

import json

from gateway.config import GatewayConfig
from tests.gateway.inprocess import StubClient, call
from zbatch.client import BrokerUnavailable

FOLLOWING = GatewayConfig()  # no default_model, no models: the one model the workers serve
TEXT = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}


def served(*names: str, idle: tuple[str, ...] = ()) -> StubClient:
    """A broker whose workers serve ``names`` (embeddings models), and which knows ``idle`` without a worker."""
    figures = {name: {"workers": 1, "info": {"task": "embeddings"}} for name in names}
    return StubClient(models=figures | {name: {"workers": 0} for name in idle})


def test_one_model_served_is_the_default_of_post_root_teis_routes_and_the_listing() -> None:
    stub = served("org/model", idle=("gone",))
    assert call(stub, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING).status == 200
    embed = call(stub, "POST", "/embed", body=json.dumps({"inputs": "hi"}).encode(), headers=JSON,
                 config=FOLLOWING)
    assert embed.status == 200
    info = call(stub, "GET", "/info", config=FOLLOWING)
    assert info.status == 200 and info.body["model_id"] == "org/model"
    assert [c["model"] for c in stub.calls] == ["org/model", "org/model"]
    assert call(stub, "GET", "/readyz", config=FOLLOWING).status == 200
    listing = {m["name"]: m["dialects"] for m in call(stub, "GET", "/models", config=FOLLOWING).body["models"]}
    assert listing["org/model"]["zbatch"] == ["POST /"] and "POST /embed" in listing["org/model"]["tei"]
    assert "zbatch" not in listing["gone"]


def test_several_models_served_and_none_named_ask_the_caller_to_name_one() -> None:
    stub = served("a", "b")
    answer = call(stub, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING)
    assert answer.status == 400 and answer.body["error"]["message"] == (
        "the workers serve several models (a, b) and the gateway names no default: name the model "
        "(POST /models/{model}), or set ZBATCH_DEFAULT_MODEL")
    tei = call(stub, "POST", "/embed", body=json.dumps({"inputs": "hi"}).encode(), headers=JSON,
                 config=FOLLOWING)
    assert tei.status == 422 and "several models (a, b)" in tei.body["error"], "TEI's status for it"
    assert call(stub, "GET", "/readyz", config=FOLLOWING).status == 200, "ready: a worker serves a model"
    assert stub.calls == []
    named = GatewayConfig(models=("b", "a"))
    assert call(stub, "POST", "/", body=b"hello", headers=TEXT, config=named).status == 200
    assert stub.calls[-1]["model"] == "b", "the first of models"
    assert call(stub, "POST", "/", body=b"hello", headers=TEXT, config=GatewayConfig(default_model="a")).status == 200
    assert stub.calls[-1]["model"] == "a"


def test_one_embeddings_model_beside_a_reranker_and_a_classifier_is_the_default() -> None:
    figures = {"embedder": {"workers": 1, "info": {"task": "embeddings"}},
               "reranker": {"workers": 1, "info": {"task": "rerank"}},
               "sentiment": {"workers": 2, "info": {"task": "text-classification"}}}
    stub = StubClient(models=figures)
    assert call(stub, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING).status == 200
    embed = call(stub, "POST", "/embed", body=json.dumps({"inputs": "hi"}).encode(), headers=JSON, config=FOLLOWING)
    assert embed.status == 200
    assert [c["model"] for c in stub.calls] == ["embedder", "embedder"]
    two = StubClient(models=figures | {"other": {"workers": 1, "info": {"task": "embeddings"}}})
    answer = call(two, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING)
    assert answer.status == 400 and "several models (embedder, other, reranker, sentiment)" in (
        answer.body["error"]["message"]), "two embeddings models: which one cannot be known"


def test_no_model_served_is_no_worker_and_no_broker_is_broker_unavailable() -> None:
    stub = served(idle=("a",))
    answer = call(stub, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING)
    assert (answer.status, answer.body["error"]["code"]) == (503, "no_worker")
    ready = call(stub, "GET", "/readyz", config=FOLLOWING)
    assert ready.status == 503 and ready.body["error"]["message"] == "no worker serves any model yet"
    assert call(stub, "GET", "/health", config=FOLLOWING).status == 503
    gone = StubClient(error=BrokerUnavailable("no broker answers"))
    answer = call(gone, "POST", "/", body=b"hello", headers=TEXT, config=FOLLOWING)
    assert (answer.status, answer.body["error"]["code"]) == (503, "broker_unavailable")


def test_an_input_over_the_limits_is_refused_before_the_model_is_looked_for() -> None:
    answer = call(served(), "POST", "/", body=b"x" * 100_001, headers=TEXT, config=FOLLOWING)
    assert (answer.status, answer.body["error"]["code"]) == (400, "input_too_long")
