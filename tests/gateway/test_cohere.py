"""Cohere's rerank in process, against a stand-in broker: the answer's shape and order, and hostile input.

The real client library against a real stack is tests/e2e/test_tools.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gateway.inprocess import CONFIG, Answer, StubClient, call
from zbatch.client import NoWorker, Overloaded, UnknownModel, WorkerError

JSON = {"Content-Type": "application/json"}
RERANK = "reranker"
REQUEST = {"model": RERANK, "query": "what is red", "documents": ["a dog", {"text": "red", "id": 7}, "blue"]}


def scores_by_text(inputs: list[Any], parameters: dict[str, Any], operation: str) -> tuple[list[Any], list[int]]:
    """A cross-encoder's stand-in: "red" scores highest, then "blue", then the rest; four tokens a pair."""
    table = {"red": 0.9, "blue": 0.5}
    return [table.get(text, 0.1) for _, text in inputs], [4] * len(inputs)


def stub(error: Exception | None = None) -> StubClient:
    return StubClient(error=error, answer=scores_by_text, models={
        RERANK: {"workers": 1, "info": {"task": "rerank"}}, "embedder": {"workers": 1, "info": {"task": "embeddings"}}})


def rerank(body: Any, path: str = "/v1/rerank", client: StubClient | None = None) -> Answer:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return call(client or stub(), "POST", path, body=data, headers=JSON)


def test_results_are_sorted_by_score_with_their_index_and_usage() -> None:
    answer = rerank(REQUEST)
    assert answer.status == 200, answer
    assert [(r["index"], r["relevance_score"]) for r in answer.body["results"]] == [(1, 0.9), (2, 0.5), (0, 0.1)]
    assert all("document" not in r for r in answer.body["results"])  # Cohere's default: no documents
    assert answer.body["usage"] == {"prompt_tokens": 12, "total_tokens": 12} and answer.headers["X-Tokens"] == "12"
    assert answer.body["meta"] == {"api_version": {"version": "1"}, "billed_units": {"search_units": 1},
                                   "tokens": {"input_tokens": 12}}
    assert answer.body["model"] == RERANK and answer.body["id"] == answer.headers["X-Request-ID"]


def test_top_n_and_return_documents() -> None:
    answer = rerank(REQUEST | {"top_n": 2, "return_documents": True}, "/v2/rerank")
    assert answer.status == 200, answer
    assert answer.body["results"] == [{"index": 1, "relevance_score": 0.9, "document": {"text": "red", "id": 7}},
                                      {"index": 2, "relevance_score": 0.5, "document": {"text": "blue"}}]
    assert answer.body["meta"]["api_version"] == {"version": "2"}
    assert len(rerank(REQUEST | {"top_n": 50}).body["results"]) == 3  # more than there are: all of them


def test_the_pairs_sent_are_the_query_with_each_documents_text() -> None:
    client = stub()
    rerank(REQUEST | {"max_chunks_per_doc": 10, "max_tokens_per_doc": 512, "truncate_prompt_tokens": -1,
                      "rank_fields": ["text"]}, client=client)
    (sent,) = client.calls
    assert sent["model"] == RERANK and sent["parameters"] == {}
    assert sent["texts"] == [["what is red", "a dog"], ["what is red", "red"], ["what is red", "blue"]]


def test_search_units_count_each_hundred_documents() -> None:
    answer = rerank(REQUEST | {"documents": ["x"] * 201})
    assert answer.body["meta"]["billed_units"] == {"search_units": 3}


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"model": RERANK, "documents": ["a"]}, 400, '"query"'),
    (REQUEST | {"query": ""}, 400, '"query"'),
    (REQUEST | {"documents": "a dog"}, 400, '"documents"'),
    (REQUEST | {"documents": []}, 400, '"documents"'),
    (REQUEST | {"documents": ["a", 5]}, 400, "documents[1]"),
    (REQUEST | {"documents": [{"title": "no text"}]}, 400, "documents[0]"),
    (REQUEST | {"documents": ["a"] * (CONFIG.max_inputs + 1)}, 400, f"the limit is {CONFIG.max_inputs}"),
    (REQUEST | {"top_n": 0}, 400, '"top_n"'),
    (REQUEST | {"top_n": "2"}, 400, '"top_n"'),
    (REQUEST | {"return_documents": "yes"}, 400, '"return_documents"'),
    (REQUEST | {"rank_fields": ["title"]}, 400, '"rank_fields"'),
    (REQUEST | {"max_chunks_per_doc": -1}, 400, '"max_chunks_per_doc"'),
    (REQUEST | {"truncate_prompt_tokens": 8}, 400, '"truncate_prompt_tokens"'),
    ({k: v for k, v in REQUEST.items() if k != "model"}, 400, '"model"'),
    (REQUEST | {"model": "embedder"}, 400, "rerank model"),
    (b'{"model": "reranker", "query":', 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"model": "reranker", "query": "q", "documents": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "JSON"),
])
def test_hostile_input_gets_cohere_errors(body: Any, status: int, words: str) -> None:
    answer = rerank(body)
    assert (answer.status, set(answer.body)) == (status, {"message"}), answer
    assert words in answer.body["message"]


@pytest.mark.parametrize(("error", "status"), [(Overloaded("full", retry_after_ms=1500), 429),
                                               (NoWorker("none"), 503), (WorkerError("boom"), 500),
                                               (UnknownModel("no such model"), 404)])
def test_broker_failures_take_cohere_statuses(error: Exception, status: int) -> None:
    answer = rerank(REQUEST, client=stub(error))
    assert (answer.status, set(answer.body)) == (status, {"message"}), answer
    assert ("Retry-After" in answer.headers) == (status == 429)


def test_models_listing_names_the_rerank_routes() -> None:
    answer = call(stub(), "GET", "/models")
    by_name = {model["name"]: model for model in answer.body["models"]}
    assert by_name[RERANK]["dialects"]["cohere"] == ["POST /v1/rerank", "POST /v2/rerank"]
    assert "cohere" not in by_name["embedder"]["dialects"]
