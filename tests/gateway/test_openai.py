"""OpenAI's embeddings in process: the fields ``vllm bench serve`` sends, as vLLM's server takes them.

``vllm bench serve --backend openai-embeddings`` posts ``{"model", "input", "truncate_prompt_tokens": -1}``
and reads ``usage.prompt_tokens``; the real stack is in tests/e2e/test_tools.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gateway.inprocess import StubClient, call

JSON = {"Content-Type": "application/json"}


def embed(body: dict[str, Any], stub: StubClient | None = None) -> Any:
    return call(stub or StubClient(), "POST", "/v1/embeddings", body=json.dumps(body).encode(), headers=JSON)


@pytest.mark.parametrize("value", [-1, None])
def test_truncate_prompt_tokens_minus_one_is_what_the_workers_do_anyway(value: int | None) -> None:
    stub = StubClient()
    answer = embed({"model": "m", "input": ["a b", "c"], "truncate_prompt_tokens": value,
                    "unknown_field": "ignored, as vLLM ignores it"}, stub)
    assert answer.status == 200, answer
    assert answer.body["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and answer.headers["X-Tokens"] == "7"
    assert stub.calls[0]["parameters"] == {}  # the workers cut at the model's maximum by default


@pytest.mark.parametrize("value", [0, 5, 512, -2, "-1", True, 1.5])
def test_a_count_of_tokens_is_refused_in_openais_shape(value: Any) -> None:
    stub = StubClient()
    answer = embed({"model": "m", "input": "a", "truncate_prompt_tokens": value}, stub)
    assert answer.status == 400 and answer.body["error"]["param"] == "truncate_prompt_tokens", answer
    assert answer.body["error"]["type"] == "invalid_request_error" and not stub.calls
