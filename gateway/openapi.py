"""The gateway's OpenAPI 3.0.3 document, served at ``GET /openapi.json``.

Written next to the handlers (gateway/handlers.py) rather than generated from
them: the gateway validates requests itself, and the document promises exactly
what it checks.  What the gateway already states as data is taken from there,
not restated: the error codes, their statuses, descriptions and headers from
gateway/errors.py, the request headers and their values from gateway/parsing.py.
Tests validate it, compare it with those sources and the routes, and fuzz the
live gateway against it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs

from gateway.config import GatewayConfig
from gateway.errors import ERRORS, ErrorCode
from gateway.parsing import MAX_TIMEOUT_DIGITS, PRIORITIES, PRIORITY_HEADER, TIMEOUT_HEADER
from gateway.tracing import MAX_REQUEST_ID_CHARS, REQUEST_ID_HEADER
from zbatch.protocol.wire import MAX_NAME_CHARS

EXAMPLE_MODEL = GatewayConfig.default_model
# An inference request can end in any error that belongs to an operation.
INFERENCE_ERRORS = tuple(error.code for error in ERRORS.values() if error.per_operation)
BROKER_QUERY_ERRORS = ("unauthorized", "overloaded", "broker_unavailable")
# The headers gateway/parsing.py reads, by the name of their parameter under components.
REQUEST_HEADERS = {TIMEOUT_HEADER: "RequestTimeout", PRIORITY_HEADER: "Priority"}
HEADER_SCHEMAS: dict[str, dict[str, str]] = {str(hdrs.RETRY_AFTER): {"type": "integer"}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: dict[str, Any], media: str = "application/json") -> dict[str, Any]:
    return {"description": description, "headers": {REQUEST_ID_HEADER: {"$ref": "#/components/headers/RequestId"}},
            "content": {media: {"schema": schema}}}


def _when(error: ErrorCode) -> str:
    """What the document says of one code: when it happens, the code, and the headers it comes with."""
    with_headers = "".join(f", with {name}" for name in error.headers)
    return f"{error.when} (`{error.code}`{with_headers})"


def _errors(*codes: str) -> dict[str, Any]:
    """The error responses of an operation that can end in ``codes``, one per status."""
    by_status: dict[str, list[ErrorCode]] = {}
    for error in sorted((ERRORS[code] for code in codes), key=lambda error: error.status):
        by_status.setdefault(str(error.status), []).append(error)
    responses = {}
    for status, errors in by_status.items():
        when = "; ".join(map(_when, errors))
        response = _answer(when[0].upper() + when[1:], _ref("Error"))
        for error in errors:
            for name, says in error.headers.items():
                response["headers"][name] = {"description": f"{says} (with `{error.code}`)",
                                             "schema": HEADER_SCHEMAS.get(name, {"type": "string"})}
        responses[status] = response
    return responses


def _inference(summary: str, body: dict[str, Any], ok: dict[str, Any],
               *path_parameters: dict[str, Any]) -> dict[str, Any]:
    headers = [{"$ref": f"#/components/parameters/{name}"} for name in ("RequestId", *REQUEST_HEADERS.values())]
    return {"post": {
        "summary": summary,
        "parameters": [*headers, *path_parameters],
        "requestBody": {"required": True, "content": body},
        "responses": {"200": ok, **_errors(*INFERENCE_ERRORS)},
    }}


def _get(summary: str, ok: dict[str, Any], *errors: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                    "responses": {"200": ok, **_errors(*errors)}}}


TEXTS = {"oneOf": [{"type": "string", "minLength": 1},
                   {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}}]}
ANY_OUTPUT = {"description": "The model's output for one input: for the embeddings task an array of floats"}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error"], "additionalProperties": False,
        "properties": {"error": {
            "type": "object", "required": ["code", "message"], "additionalProperties": False,
            "properties": {"code": {"type": "string", "enum": list(ERRORS)},
                           "message": {"type": "string", "description": "What happened and what to do"}},
        }},
    },
    "ModelRequest": {
        "type": "object", "required": ["inputs"], "example": {"inputs": ["first text", "second text"]},
        "properties": {"inputs": TEXTS,
                       "parameters": {"type": "object", "description": "Passed to the model, e.g. top_k"}},
    },
    "EmbeddingsRequest": {
        "type": "object", "required": ["model", "input"], "example": {"model": EXAMPLE_MODEL, "input": "hello"},
        "properties": {"model": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
                       "input": TEXTS,
                       "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float"}},
    },
    "EmbeddingsResponse": {
        "type": "object", "required": ["object", "data", "model", "usage"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": {
                "type": "object", "required": ["object", "index", "embedding"],
                "properties": {"object": {"type": "string", "enum": ["embedding"]},
                               "index": {"type": "integer", "minimum": 0},
                               "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}},
                                                       {"type": "string", "format": "byte"}]}}}},
            "model": {"type": "string"},
            "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                       "total_tokens": {"type": "integer"}}},
        },
    },
    "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    "Stats": {
        "type": "object", "description": "The broker's STATS payload (zbatch/protocol/PROTOCOL.md, section 3.6)",
        "properties": {"uptime_s": {"type": "number"}, "draining": {"type": "boolean"},
                       "models": {"type": "object", "additionalProperties": {"type": "object"}},
                       "workers": {"type": "array", "items": {"type": "object"}}},
    },
    "Models": {
        "type": "object", "required": ["models"],
        "properties": {"models": {"type": "array", "items": {
            "type": "object", "required": ["name", "workers", "stats"],
            "properties": {"name": {"type": "string"},
                           "workers": {"type": "array", "items": {"type": "object"}},
                           "stats": {"type": "object"}}}}},
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "zbatch gateway", "version": "1",
             "description": "Hugging Face models behind a batching ZeroMQ broker. Every answer carries "
                            f"{REQUEST_ID_HEADER}; every error is `{{\"error\": {{\"code\", \"message\"}}}}`."},
    "paths": {
        "/": _inference(
            "Run the default model on the raw body (curl -d)",
            {"text/plain": {"schema": {"type": "string", "minLength": 1}, "example": "hello world"}},
            _answer("The default model's output", ANY_OUTPUT)),
        "/models/{model}": _inference(
            "Run a model on one text or a list (Hugging Face Inference API shape)",
            {"application/json": {"schema": _ref("ModelRequest")}},
            _answer("One output for a string, a list in input order for a list", ANY_OUTPUT),
            {"name": "model", "in": "path", "required": True, "example": EXAMPLE_MODEL,
             "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}),
        "/v1/embeddings": _inference(
            "OpenAI-compatible embeddings",
            {"application/json": {"schema": _ref("EmbeddingsRequest")}},
            _answer("Embeddings in input order", _ref("EmbeddingsResponse"))),
        "/healthz": _get("Liveness: the gateway process answers", _answer("Up", _ref("Status"))),
        "/readyz": _get("Readiness: a broker answers, is not draining and has a worker for every required model "
                        "(with several brokers, the body's brokers map says which are ready and why not)",
                        _answer("Ready", _ref("Status")), *BROKER_QUERY_ERRORS, "no_worker"),
        "/models": _get("Models the brokers know, their figures and workers", _answer("Models", _ref("Models")),
                        *BROKER_QUERY_ERRORS),
        "/v1/stats": _get("The brokers' statistics, merged; each broker's own under brokers",
                          _answer("Statistics", _ref("Stats")), *BROKER_QUERY_ERRORS),
        "/metrics": _get("Prometheus metrics of the gateway (text exposition format); needs a key only with "
                         "protect_metrics", _answer("Metrics", {"type": "string"}, "text/plain"), "unauthorized"),
        "/openapi.json": _get("This document", _answer("OpenAPI 3.0.3 document", {"type": "object"}), "unauthorized"),
    },
    # API keys are optional: with api_keys_file set, every endpoint but /healthz needs one.
    "security": [{}, {"apiKey": []}],
    "components": {
        "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                       "description": "A key from the gateway's api_keys_file"}},
        "schemas": SCHEMAS,
        "parameters": {
            "RequestId": {"name": REQUEST_ID_HEADER, "in": "header", "required": False,
                          "description": "Your id for this request, echoed back and written in the logs of the "
                                         "gateway, broker and worker; a new one is made if absent or not "
                                         f"1-{MAX_REQUEST_ID_CHARS} printable ASCII characters",
                          "schema": {"type": "string", "maxLength": MAX_REQUEST_ID_CHARS}},
            "RequestTimeout": {"name": TIMEOUT_HEADER, "in": "header", "required": False,
                               "description": "Shortens the request's deadline (never beyond the configured one)",
                               "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_TIMEOUT_DIGITS}}}$"}},
            "Priority": {"name": PRIORITY_HEADER, "in": "header", "required": False,
                         "description": "The request's priority at the broker: high, normal (the default) or low, "
                                        "or the protocol's 0, 1, 2; case is ignored",
                         "schema": {"type": "string", "enum": list(PRIORITIES), "default": "normal"}},
        },
        "headers": {
            "RequestId": {"description": "The request's id: yours if valid, else a new one",
                          "schema": {"type": "string"}},
        },
    },
}
