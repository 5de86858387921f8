"""The gateway's OpenAPI 3.0.3 document, served at ``GET /openapi.json``.

Written next to the handlers (gateway/handlers.py, and the dialects' in
gateway/dialects/documented.py) rather than generated from them: the gateway
validates requests itself, and the document promises exactly what it checks.
What the gateway already states as data is taken from there, not restated:
the error codes, their statuses (in each dialect), descriptions and headers
from gateway/errors.py, the request headers and their values from
gateway/parsing.py.
Tests validate it, compare it with those sources and the routes, and fuzz the
live gateway against it.
"""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.dialects import Dialect, documented
from gateway.errors import ERRORS
from gateway.inference import TOKENS_HEADER
from gateway.openapi_parts import (
    BROKER_QUERY_ERRORS,
    answer,
    get,
    inference,
    model_parameter,
    ref,
)
from gateway.parsing import MAX_TIMEOUT_DIGITS, PRIORITIES, PRIORITY_HEADER, TIMEOUT_HEADER
from gateway.tracing import MAX_REQUEST_ID_CHARS, REQUEST_ID_HEADER
from zbatch.protocol.wire import MAX_NAME_CHARS

EXAMPLE_MODEL = GatewayConfig.default_model


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
        "properties": {
            "inputs": {"oneOf": [TEXTS, {"type": "object", "required": ["source_sentence", "sentences"],
                                         "description": "sentence-similarity (an embeddings model)",
                                         "properties": {"source_sentence": {"type": "string", "minLength": 1},
                                                        "sentences": {"type": "array", "minItems": 1,
                                                                      "items": {"type": "string",
                                                                                "minLength": 1}}}}],
                       "description": "Texts; for an image model, images in base64; or sentence-similarity's "
                                      "source_sentence and sentences"},
            "parameters": {"type": "object", "description": "Passed to the model, e.g. top_k"},
            **documented.TRUNCATION, "normalize": documented.FLAG,
        },
    },
    "EmbeddingsRequest": {
        "type": "object", "required": ["model", "input"], "example": {"model": EXAMPLE_MODEL, "input": "hello"},
        "properties": {"model": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
                       "input": TEXTS,
                       "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float"},
                       "dimensions": {"type": "integer", "minimum": 1,
                                      "description": "Only the first N numbers, re-normalised"},
                       "user": {"type": "string"}},
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
            "type": "object", "required": ["name", "task", "dialects", "workers", "stats"],
            "properties": {"name": {"type": "string"},
                           "task": {"type": "string", "nullable": True},
                           "dialects": {"type": "object", "description": "The routes that answer the model, "
                                                                         "by dialect",
                                        "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                           "workers": {"type": "array", "items": {"type": "object"}},
                           "stats": {"type": "object"}}}}},
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "zbatch gateway", "version": "1",
             "description": "Hugging Face models behind a batching ZeroMQ broker. Every answer carries "
                            f"{REQUEST_ID_HEADER} and every inference answer {TOKENS_HEADER}; every error is "
                            "`{\"error\": {\"code\", \"message\"}}`, except on other dialects' paths, in "
                            "their shape: OpenAI's under /v1, TEI's on TEI's routes, KServe's under /v2."},
    "paths": {
        "/": inference(
            "Run the default model on the raw body (curl -d)",
            {"text/plain": {"schema": {"type": "string", "minLength": 1}, "example": "hello world"}},
            answer("The default model's output", ANY_OUTPUT, tokens=True)),
        "/models/{model}": inference(
            "Run a model (Hugging Face Inference API shapes): texts, sentence-similarity, or images (the body, "
            "or base64 in JSON)",
            {"application/json": {"schema": ref("ModelRequest")},
             "image/png": {"schema": {"type": "string", "format": "binary"}},
             "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            answer("One output for a string or an image body, a list in input order for a list; similarities "
                   "for sentence-similarity", ANY_OUTPUT, tokens=True),
            model_parameter(EXAMPLE_MODEL)),
        "/v1/embeddings": inference(
            "OpenAI: embeddings, with usage from the model's token counts",
            {"application/json": {"schema": ref("EmbeddingsRequest")}},
            answer("Embeddings in input order", ref("EmbeddingsResponse"), tokens=True), dialect=Dialect.OPENAI),
        "/healthz": get("Liveness: the gateway process answers", answer("Up", ref("Status"))),
        "/readyz": get("Readiness: a broker answers, is not draining and has a worker for every required model "
                        "(with several brokers, the body's brokers map says which are ready and why not)",
                        answer("Ready", ref("Status")), *BROKER_QUERY_ERRORS, "no_worker"),
        "/models": get("Models the brokers know, their figures and workers", answer("Models", ref("Models")),
                        *BROKER_QUERY_ERRORS),
        "/v1/stats": get("The brokers' statistics, merged; each broker's own under brokers",
                          answer("Statistics", ref("Stats")), *BROKER_QUERY_ERRORS),
        "/metrics": get("Prometheus metrics of the gateway (text exposition format); needs a key only with "
                         "protect_metrics", answer("Metrics", {"type": "string"}, "text/plain"), "unauthorized"),
        "/openapi.json": get("This document", answer("OpenAPI 3.0.3 document", {"type": "object"}), "unauthorized"),
        **documented.PATHS,
    },
    # API keys are optional: with api_keys_file set, every endpoint but /healthz needs one.
    "security": [{}, {"apiKey": []}],
    "components": {
        "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                       "description": "A key from the gateway's api_keys_file"}},
        "schemas": SCHEMAS | documented.SCHEMAS,
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
            "Tokens": {"description": f"{TOKENS_HEADER}: the tokens the model took for the request (special tokens "
                                      "included, after truncation), for billing; absent for images",
                       "schema": {"type": "integer"}},
        },
    },
}
