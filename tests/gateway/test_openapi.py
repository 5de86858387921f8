"""The OpenAPI document against what the gateway really does: its routes, its error table, its headers.

Each test compares the document with a source it must not drift from, so a
new route, error code or request header fails here until it is documented.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from openapi_spec_validator import validate

from gateway.app import ROUTES, create_app
from gateway.dialects import error_shape_of
from gateway.dialects.kserve import HEADER_LENGTH
from gateway.errors import ERRORS, ErrorCode
from gateway.openapi import DOCUMENT
from gateway.parsing import PRIORITIES, PRIORITY_HEADER
from tests.gateway.inprocess import CONFIG, StubClient, call, sparse

JSON = "application/json"
INFERENCE = {"/": (b"hello", "text/plain"),
             "/models/{model}": (b'{"inputs": "hello"}', JSON),
             "/v1/embeddings": (b'{"model": "m", "input": "hello"}', JSON),
             "/embed": (b'{"inputs": "hello"}', JSON),
             "/rerank": (b'{"query": "q", "texts": ["a", "b"]}', JSON),
             "/predict": (b'{"inputs": "hello"}', JSON),
             "/similarity": (b'{"inputs": {"source_sentence": "a", "sentences": ["b"]}}', JSON),
             "/tokenize": (b'{"inputs": "hello"}', JSON),
             "/embed_all": (b'{"inputs": "hello"}', JSON),
             "/embed_sparse": (b'{"inputs": "hello"}', JSON),
             "/decode": (b'{"ids": [1, 2]}', JSON),
             "/v1/rerank": (b'{"model": "m", "query": "q", "documents": ["a", "b"]}', JSON),
             "/v2/rerank": (b'{"model": "m", "query": "q", "documents": ["a", "b"]}', JSON),
             "/v2/models/{model}/infer": (b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], '
                                          b'"data": ["hello"]}]}', JSON)}
# Standard headers documented otherwise (the security scheme, the request body's media types,
# the media types of /metrics's answer) or that aiohttp answers itself (100-continue).
DOCUMENTED_ELSEWHERE = {"authorization", "content-type", "accept", "expect"}


def stub_for(path: str) -> StubClient:
    """A broker stand-in whose answers the route can read."""
    return StubClient(answer=sparse) if path == "/embed_sparse" else StubClient()


def status_in(error: ErrorCode, path: str) -> int:
    """The status ``error`` is answered with on ``path``, in its dialect."""
    return error_shape_of(path.replace("{model}", "m")).status(error)


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def header_parameters(operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The operation's header parameters by lowercase name, references resolved."""
    parameters = DOCUMENT["components"]["parameters"]
    resolved = [parameters[p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p for p in operation["parameters"]]
    return {p["name"].lower(): p for p in resolved if p["in"] == "header"}


def test_the_document_is_valid_openapi() -> None:
    validate(DOCUMENT)


def test_every_route_is_documented_and_nothing_else() -> None:
    routes = {(route.method.lower(), route.resource.canonical) for route in create_app(CONFIG).router.routes()
              if route.resource is not None and route.method != "HEAD"}
    assert routes == {(method, path) for method, path, _ in operations()}
    assert len(ROUTES) == len(routes)


def test_the_error_enum_is_the_error_table() -> None:
    error = DOCUMENT["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["properties"]["code"]["enum"] == list(ERRORS)


@pytest.mark.parametrize("path", INFERENCE)
def test_an_inference_route_documents_every_error_of_an_operation(path: str) -> None:
    responses = DOCUMENT["paths"][path]["post"]["responses"]
    for error in ERRORS.values():
        if error.per_operation:
            response = responses[str(status_in(error, path))]
            assert f"`{error.code}`" in response["description"], (path, error.code)
            assert set(error.headers) <= set(response["headers"]), (path, error.code)


def test_each_error_response_names_codes_of_its_status_only() -> None:
    for method, path, operation in operations():
        for status, response in operation["responses"].items():
            if status != "200":
                codes = re.findall(r"`(\w+)`", response["description"])
                assert codes, (method, path, status)
                statuses = {str(status_in(ERRORS[code], path)) for code in codes}
                assert statuses == {status}, (method, path, status)


@pytest.mark.parametrize("path", INFERENCE)
def test_the_priority_header_is_documented_with_every_value_it_takes(path: str) -> None:
    documented = header_parameters(DOCUMENT["paths"][path]["post"])[PRIORITY_HEADER.lower()]
    assert documented["schema"]["enum"] == list(PRIORITIES)
    body, media = INFERENCE[path]
    for value in documented["schema"]["enum"]:
        stub = stub_for(path)
        answer = call(stub, "POST", path.replace("{model}", "m"), body=body,
                      headers={"Content-Type": media, PRIORITY_HEADER: value})
        assert answer.status == 200, answer
        assert stub.calls[0]["priority"] == PRIORITIES[value]


def read_headers(monkeypatch: pytest.MonkeyPatch, method: str, path: str, headers: dict[str, str],
                 body: bytes = b"") -> set[str]:
    """The names of the request headers the gateway looked up while answering, in lowercase."""
    read: set[str] = set()
    original = web.BaseRequest.headers

    class Recording:
        def __init__(self, headers: Any) -> None:
            self._headers = headers

        def get(self, name: str, default: Any = None) -> Any:
            read.add(name.lower())
            return self._headers.get(name, default)

        def __getitem__(self, name: str) -> Any:
            read.add(name.lower())
            return self._headers[name]

        def __contains__(self, name: object) -> bool:
            read.add(str(name).lower())
            return name in self._headers

        def __getattr__(self, attribute: str) -> Any:
            raise AssertionError(f"headers.{attribute} is not recorded: add it to Recording")

    monkeypatch.setattr(web.BaseRequest, "headers",
                        property(lambda request: Recording(original.__get__(request, type(request)))))
    answer = call(stub_for(path), method, path, body=body, headers=headers)
    monkeypatch.undo()
    assert answer.status == 200, answer
    return read


def test_every_header_the_gateway_reads_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    for method, path, operation in operations():
        body, media = INFERENCE.get(path, (b"", ""))
        # Every documented header, set to a value the gateway takes, so that each is read.
        sent = {"Content-Type": media} if media else {}
        for name, parameter in header_parameters(operation).items():
            schema = parameter["schema"]
            sent[name] = schema["enum"][0] if "enum" in schema else "250"
        if HEADER_LENGTH.lower() in sent:  # the binary form, whose JSON part is here the whole body
            sent[HEADER_LENGTH.lower()] = str(len(body))
        read = read_headers(monkeypatch, method.upper(), path.replace("{model}", "m"), sent, body)
        documented = set(header_parameters(operation)) | DOCUMENTED_ELSEWHERE
        assert read <= documented, (method, path, read - documented)
        if path in INFERENCE:
            assert {PRIORITY_HEADER.lower(), "x-request-timeout-ms"} <= read, (path, read)
