"""The gateway on its own: validation, error shapes, limits and health with no broker listening."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.gateway.conftest import Gateway

JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}


@pytest.fixture(scope="module")
def gateway(start_gateway: Callable[..., Gateway]) -> Gateway:
    return start_gateway()


@pytest.fixture(scope="module")
def small_gateway(start_gateway: Callable[..., Gateway]) -> Gateway:
    return start_gateway("--max-body-bytes", "1000")


def test_healthz_answers_ok(gateway: Gateway) -> None:
    response = gateway.request("GET", "/healthz")
    assert response.status == 200
    assert response.json() == {"status": "ok"}


def test_readyz_says_the_broker_is_unreachable(gateway: Gateway) -> None:
    response = gateway.request("GET", "/readyz")
    assert response.status == 503
    assert response.error_code() == "broker_unavailable"
    assert gateway.frontend in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/models/all-MiniLM-L6-v2"),
        ("POST", "/models/sentence-transformers/all-MiniLM-L6-v2"),
        ("POST", "/v1/embeddings"),
        ("POST", "/"),
        ("GET", "/models"),
        ("GET", "/v1/stats"),
    ],
)
def test_well_formed_requests_get_broker_unavailable(
    gateway: Gateway, method: str, path: str
) -> None:
    if path == "/":
        response = gateway.request("POST", "/", b"hello world", TEXT)
    elif path == "/v1/embeddings":
        response = gateway.post_json(path, {"model": "m", "input": ["a", "b"]})
    elif method == "POST":
        response = gateway.post_json(path, {"inputs": "hello", "parameters": {"normalize": True}})
    else:
        response = gateway.request(method, path)
    assert response.status == 503
    assert response.error_code() == "broker_unavailable"


def test_curl_style_form_body_is_accepted_as_text(gateway: Gateway) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert gateway.request("POST", "/", b"hello world", form).error_code() == "broker_unavailable"
    assert gateway.request("POST", "/", b"hello world").error_code() == "broker_unavailable"


def _json(data: object) -> bytes:
    return json.dumps(data).encode()


MODEL = "/models/m"
BAD_REQUESTS = {
    "malformed JSON": ("POST", MODEL, b'{"inputs": ', JSON),
    "body not an object": ("POST", MODEL, _json(["a"]), JSON),
    "empty JSON body": ("POST", MODEL, b"", JSON),
    "missing inputs": ("POST", MODEL, _json({"parameters": {}}), JSON),
    "inputs a number": ("POST", MODEL, _json({"inputs": 5}), JSON),
    "inputs an object": ("POST", MODEL, _json({"inputs": {"text": "a"}}), JSON),
    "inputs list of numbers": ("POST", MODEL, _json({"inputs": ["a", 3]}), JSON),
    "inputs empty list": ("POST", MODEL, _json({"inputs": []}), JSON),
    "inputs empty string": ("POST", MODEL, _json({"inputs": ""}), JSON),
    "inputs list with empty string": ("POST", MODEL, _json({"inputs": ["a", ""]}), JSON),
    "parameters a list": ("POST", MODEL, _json({"inputs": "a", "parameters": [1]}), JSON),
    "parameters a string": ("POST", MODEL, _json({"inputs": "a", "parameters": "x"}), JSON),
    "deeply nested JSON": ("POST", MODEL, b"[" * 100_000 + b"]" * 100_000, JSON),
    "model name too long": ("POST", "/models/" + "m" * 200, _json({"inputs": "a"}), JSON),
    "empty text body": ("POST", "/", b"", TEXT),
    "text not utf-8": ("POST", "/", b"\xff\xfe\xfa", TEXT),
    "openai missing model": ("POST", "/v1/embeddings", _json({"input": "a"}), JSON),
    "openai model not a string": (
        "POST",
        "/v1/embeddings",
        _json({"model": 5, "input": "a"}),
        JSON,
    ),
    "openai missing input": ("POST", "/v1/embeddings", _json({"model": "m"}), JSON),
    "openai token ids not whole numbers": ("POST", "/v1/embeddings", _json({"model": "m", "input": [[1, 2.5]]}),
                                           JSON),
    "openai token ids below 0": ("POST", "/v1/embeddings", _json({"model": "m", "input": [-1, 2]}), JSON),
    "openai empty input list": ("POST", "/v1/embeddings", _json({"model": "m", "input": []}), JSON),
    "openai encoding_format": (
        "POST",
        "/v1/embeddings",
        _json({"model": "m", "input": "a", "encoding_format": "int8"}),
        JSON,
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_malformed_requests_get_400(gateway: Gateway, case: str) -> None:
    method, path, body, headers = BAD_REQUESTS[case]
    response = gateway.request(method, path, body, headers)
    assert response.status == 400, response
    assert response.error_code() == "bad_request"


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5", "", "12345678901", "²"])
@pytest.mark.parametrize("path", [MODEL, "/", "/v1/embeddings"])
def test_bad_timeout_header_gets_400(gateway: Gateway, path: str, value: str) -> None:
    body = {MODEL: {"inputs": "a"}, "/": None, "/v1/embeddings": {"model": "m", "input": "a"}}[path]
    headers = {"X-Request-Timeout-Ms": value}
    if body is None:
        response = gateway.request("POST", path, b"hello", {**TEXT, **headers})
    else:
        response = gateway.post_json(path, body, headers)
    assert response.status == 400, response
    assert "X-Request-Timeout-Ms" in response.json()["error"]["message"]


def test_good_timeout_header_is_accepted(gateway: Gateway) -> None:
    response = gateway.post_json(MODEL, {"inputs": "a"}, {"X-Request-Timeout-Ms": "250"})
    assert response.error_code() == "broker_unavailable"


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        (MODEL, TEXT),
        (MODEL, {}),
        (MODEL, {"Content-Type": "application/x-www-form-urlencoded"}),
        ("/v1/embeddings", {"Content-Type": "text/plain"}),
        ("/", {"Content-Type": "application/octet-stream"}),  # JSON at / is TEI's (tests/gateway/test_tei_root.py)
    ],
)
def test_wrong_content_type_gets_415(gateway: Gateway, path: str, headers: dict[str, str]) -> None:
    response = gateway.request(
        "POST", path, _json({"inputs": "a", "model": "m", "input": "a"}), headers
    )
    assert response.status == 415, response
    assert response.error_code() == "unsupported_media_type"


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/nope"), ("POST", "/v3/models/m"), ("GET", "/models/")]
)
def test_unknown_path_gets_json_404(gateway: Gateway, method: str, path: str) -> None:
    response = gateway.request(method, path)
    assert response.status == 404
    assert response.error_code() == "not_found"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", MODEL),
        ("GET", "/v1/embeddings"),
        ("POST", "/healthz"),
        ("DELETE", "/readyz"),
    ],
)
def test_wrong_method_gets_json_405(gateway: Gateway, method: str, path: str) -> None:
    response = gateway.request(method, path)
    assert response.status == 405
    assert response.error_code() == "method_not_allowed"
    assert response.headers["allow"]


def test_body_over_the_limit_gets_413(small_gateway: Gateway) -> None:
    big = _json({"inputs": "x" * 2000})
    response = small_gateway.request("POST", MODEL, big, JSON)
    assert response.status == 413
    assert response.error_code() == "payload_too_large"
    response = small_gateway.request("POST", "/", b"x" * 2000, TEXT)
    assert response.status == 413
    assert response.error_code() == "payload_too_large"


def test_chunked_body_over_the_limit_gets_413(small_gateway: Gateway) -> None:
    chunks = [b'{"inputs": "', b"x" * 600, b"x" * 600, b'"}']
    response = small_gateway.request("POST", MODEL, iter(chunks), JSON)
    assert response.status == 413
    assert response.error_code() == "payload_too_large"


def test_body_under_the_limit_passes(small_gateway: Gateway) -> None:
    response = small_gateway.post_json(MODEL, {"inputs": "x" * 900})
    assert response.error_code() == "broker_unavailable"
    response = small_gateway.request("POST", MODEL, iter([b'{"inputs": ', b'"short"}']), JSON)
    assert response.error_code() == "broker_unavailable"


def test_nothing_unexpected_was_logged(gateway: Gateway, small_gateway: Gateway) -> None:
    for started in (gateway, small_gateway):
        assert "Traceback" not in started.log()


@pytest.mark.parametrize("value", ["urgent", "3", "-1", ""])
def test_bad_priority_header_gets_400(gateway: Gateway, value: str) -> None:
    response = gateway.post_json(MODEL, {"inputs": "a"}, {"X-Priority": value})
    assert response.status == 400 and "X-Priority" in response.json()["error"]["message"]


@pytest.mark.parametrize("value", ["high", "LOW", "normal", "0", "2"])
def test_good_priority_header_is_accepted(gateway: Gateway, value: str) -> None:
    response = gateway.post_json(MODEL, {"inputs": "a"}, {"X-Priority": value})
    assert response.error_code() == "broker_unavailable"
