"""The gateway's OpenAPI 3.0.3 document, served at ``GET /openapi.json``.

Written by hand next to the handlers (gateway/app.py) rather than generated:
the gateway validates requests itself, and the document promises exactly
what it checks.  Tests validate it and fuzz the live gateway against it.
"""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.tracing import MAX_REQUEST_ID_CHARS, REQUEST_ID_HEADER
from zbatch.protocol.wire import MAX_NAME_CHARS

ERROR_CODES = [
    "bad_request", "unknown_model", "not_found", "method_not_allowed", "payload_too_large",
    "unsupported_media_type", "worker_error", "worker_lost", "internal_error", "overloaded", "no_worker",
    "broker_unavailable", "deadline_exceeded", "unauthorized", "too_many_inputs", "input_too_long",
]
ERROR_WHEN = {
    "400": "Malformed JSON, wrong types, empty input, bad parameters or a bad header (`bad_request`); "
           "an input longer than the gateway's limit (`input_too_long`)",
    "401": "The gateway has API keys and the request carries none of them (`unauthorized`, with "
           "WWW-Authenticate)",
    "404": "No worker serves the model (`unknown_model`)",
    "413": "The body is larger than the gateway's limit (`payload_too_large`), or it holds more inputs "
           "(`too_many_inputs`)",
    "415": "Wrong Content-Type (`unsupported_media_type`)",
    "500": "The model failed on this input (`worker_error`); the other inputs of its batch still succeed",
    "502": "The worker died and the broker's retry budget is spent (`worker_lost`); retry",
    "503": "Backlog full (`overloaded`, with Retry-After), no worker right now (`no_worker`), "
           "or the broker is not reachable (`broker_unavailable`); too many requests in flight at the gateway "
           "(`overloaded`, with Retry-After)",
    "504": "The deadline passed first (`deadline_exceeded`)",
}
INFERENCE_ERRORS = ("400", "401", "404", "413", "415", "500", "502", "503", "504")
EXAMPLE_MODEL = GatewayConfig.default_model


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _answer(description: str, schema: dict[str, Any], media: str = "application/json") -> dict[str, Any]:
    return {"description": description, "headers": {REQUEST_ID_HEADER: {"$ref": "#/components/headers/RequestId"}},
            "content": {media: {"schema": schema}}}


def _errors(*statuses: str) -> dict[str, Any]:
    responses = {status: _answer(ERROR_WHEN[status], _ref("Error")) for status in statuses}
    if "503" in responses:
        responses["503"]["headers"]["Retry-After"] = {
            "description": "Seconds to wait before retrying (with `overloaded`)", "schema": {"type": "integer"}}
    if "401" in responses:
        responses["401"]["headers"]["WWW-Authenticate"] = {
            "description": "`Bearer realm=\"zbatch\"`", "schema": {"type": "string"}}
    return responses


def _inference(summary: str, body: dict[str, Any], ok: dict[str, Any],
               *path_parameters: dict[str, Any]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "parameters": [{"$ref": "#/components/parameters/RequestId"},
                       {"$ref": "#/components/parameters/RequestTimeout"}, *path_parameters],
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
            "properties": {"code": {"type": "string", "enum": ERROR_CODES},
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
        "/readyz": _get("Readiness: the broker answers and every required model has a worker",
                        _answer("Ready", _ref("Status")), "401", "503"),
        "/models": _get("Models the broker knows, their figures and workers", _answer("Models", _ref("Models")),
                        "401", "503"),
        "/v1/stats": _get("The broker's statistics", _answer("Statistics", _ref("Stats")), "401", "503"),
        "/metrics": _get("Prometheus metrics of the gateway (text exposition format); needs a key only with "
                         "protect_metrics", _answer("Metrics", {"type": "string"}, "text/plain"), "401"),
        "/openapi.json": _get("This document", _answer("OpenAPI 3.0.3 document", {"type": "object"}), "401"),
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
            "RequestTimeout": {"name": "X-Request-Timeout-Ms", "in": "header", "required": False,
                               "description": "Shortens the request's deadline (never beyond the configured one)",
                               "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"}},
        },
        "headers": {
            "RequestId": {"description": "The request's id: yours if valid, else a new one",
                          "schema": {"type": "string"}},
        },
    },
}
