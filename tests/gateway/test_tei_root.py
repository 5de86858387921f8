"""JSON at ``POST /`` is TEI's root, answered by the TEI route of the root model's task; text stays text.

In process, against a stand-in broker; the real clients against a real stack are in tests/e2e/test_tools.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.inprocess import CONFIG, Answer, StubClient, call, sparse, vectors
from zbatch.client import Overloaded

JSON = {"Content-Type": "application/json"}
MODEL = CONFIG.default_model  # the root's model


def root_stub(task: str | None, answer: Any = vectors) -> StubClient:
    """A broker whose default model does ``task`` (None: not known yet)."""
    info = {} if task is None else {"info": {"task": task}}
    return StubClient(answer=answer, models={MODEL: {"workers": 1, **info}})


def post_root(stub: StubClient, body: bytes, headers: dict[str, str] | None = None) -> Answer:
    return call(stub, "POST", "/", body=body, headers=JSON if headers is None else headers)


@pytest.mark.parametrize("task", ["embeddings", None])
def test_inputs_are_teis_embed_for_an_embeddings_model(task: str | None) -> None:
    stub = root_stub(task)
    answer = post_root(stub, b'{"inputs": "hello", "normalize": true, "truncate": true, "dimensions": 2}')
    assert answer.status == 200 and answer.body == [[0.5, 0.25]], answer  # always a list of vectors, as /embed
    assert answer.headers["x-compute-tokens"] == "3" and answer.headers["x-compute-characters"] == "5"
    assert stub.calls[0]["model"] == MODEL and stub.calls[0]["texts"] == ["hello"]
    assert stub.calls[0]["parameters"] == {"normalize": True, "dimensions": 2, "truncate": True}


def test_the_root_answers_as_the_route_of_its_models_task() -> None:
    ranks = post_root(root_stub("rerank"), b'{"query": "q", "texts": ["a", "b"], "return_text": true}')
    assert ranks.status == 200 and ranks.body == [{"index": 1, "score": 0.51, "text": "b"},
                                                  {"index": 0, "score": 0.5, "text": "a"}]
    labels = post_root(root_stub("text-classification", lambda inputs, p, o: (
        [[{"label": "positive", "score": 0.9}] for _ in inputs], [3] * len(inputs))), b'{"inputs": "good"}')
    assert labels.status == 200 and labels.body == [{"label": "positive", "score": 0.9}]
    entries = post_root(root_stub("sparse-embeddings", sparse), b'{"inputs": ["a"]}')
    assert entries.status == 200 and entries.body == [[{"index": 3, "value": 0.5}, {"index": 17, "value": 1.25}]]


def test_a_model_teis_root_has_no_route_for_is_refused_in_teis_shape() -> None:
    answer = post_root(root_stub("image-classification"), b'{"inputs": "x"}')
    assert answer.status == 424 and answer.body["error_type"] == "Backend", answer
    assert "image-classification model" in answer.body["error"] and "POST /models/" in answer.body["error"]


def test_text_stays_text() -> None:
    stub = root_stub("embeddings")
    for body, media in ((b'{"inputs": "x"}', "text/plain"), (b'{"inputs": "x"}', "application/x-www-form-urlencoded")):
        answer = post_root(stub, body, {"Content-Type": media})
        assert answer.status == 200 and answer.body == [0.5, 0.25], answer  # one vector: the gateway's answer
    assert [c["texts"] for c in stub.calls] == [['{"inputs": "x"}']] * 2
    refused = post_root(stub, b"hello", {"Content-Type": "image/png"})
    assert refused.status == 415 and refused.body["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("body", [
    b"", b"{not json", b'"just a string"', b"[1, 2]", b'{"inputs": 5}', b'{"inputs": []}', b'{"inputs": [""]}',
    b'{"inputs": [1, 2]}', b'{"inputs": {"a": 1}}', b'{"inputs": "x", "normalize": "yes"}',
    b'{"inputs": "x", "truncation_direction": "up"}', b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"inputs": ["a"], "dimensions": 0}', b"\xff\xfe\x00",
])
def test_hostile_json_gets_teis_422_and_reaches_no_worker(body: bytes) -> None:
    stub = root_stub("embeddings")
    answer = post_root(stub, body)
    assert answer.status == 422 and set(answer.body) == {"error", "error_type"}, answer
    assert answer.body["error_type"] == "Validation" and not stub.calls


def test_limits_and_overload_take_teis_statuses() -> None:
    too_many = post_root(root_stub("embeddings"), b'{"inputs": [%s]}' % b", ".join([b'"a"'] * (CONFIG.max_inputs + 1)))
    assert too_many.status == 422 and too_many.body == {
        "error": f"batch size {CONFIG.max_inputs + 1} > maximum allowed batch size {CONFIG.max_inputs}",
        "error_type": "Validation"}
    bomb = post_root(root_stub("embeddings"), b'{"inputs": "%s"}' % (b"a" * CONFIG.max_body_bytes))
    assert bomb.status == 413 and bomb.body["error_type"] == "Validation", bomb
    busy = StubClient(error=Overloaded("full", retry_after_ms=1000), models={MODEL: {"workers": 1}})
    overloaded = post_root(busy, b'{"inputs": "x"}')
    assert overloaded.status == 429 and overloaded.body["error_type"] == "Overloaded"
    assert overloaded.headers["Retry-After"] == "1"


def test_models_listing_names_teis_root_for_the_default_model() -> None:
    listing = call(root_stub("embeddings"), "GET", "/models").body
    (model,) = listing["models"]
    assert model["dialects"]["tei"][-1] == "POST /" and model["dialects"]["zbatch"] == ["POST /"]


@pytest.mark.parametrize(("body", "normalize"),
                         [(b'{"inputs": "x"}', True), (b'{"inputs": "x", "normalize": false}', False)])
def test_teis_embed_normalizes_unless_told_not_to_whatever_the_model_declares(body: bytes, normalize: bool) -> None:
    """TEI's /embed (and its root) default ``normalize`` to true; the workers' default is the model's own
    modules (a model without Normalize answers raw vectors), so the dialect states TEI's default."""
    for path in ("/", "/embed"):
        stub = root_stub("embeddings")
        answer = call(stub, "POST", path, body=body, headers=JSON)
        assert answer.status == 200, answer
        assert stub.calls[0]["parameters"]["normalize"] is normalize
