"""OpenAI's API under ``/v1``: the model list and embeddings, so the official SDK works by changing its base URL.

* ``GET /v1/models`` and ``GET /v1/models/{model}``: every model a worker serves now
  (from the brokers' STATS); ``created`` is when the oldest broker started.
* ``POST /v1/embeddings``: ``model``, ``input`` (a string or a list of strings; or
  token ids, a list of whole numbers or a list of such lists, which the worker runs as
  the model's encoding as they are: send what ``/tokenize`` gives, special tokens
  included), ``encoding_format`` (``float`` or ``base64``: little-endian
  float32, which the SDK asks for by default), ``dimensions`` (the first N numbers,
  re-normalised by the worker; more than the model has is a 400) and ``user``
  (ignored); and, beyond OpenAI's fields (the SDK's ``extra_body``), ``prompt_name``
  (a prompt of the model's, as TEI's), and vLLM's ``truncate_prompt_tokens``, which
  ``vllm bench serve`` sends: -1 (cut at the model's maximum length, as the workers
  do anyway) or null; a count of tokens is a 400 (gateway/parsing.py).  Other fields
  are ignored, as vLLM ignores them.  ``usage`` counts the tokens the model took
  (PROTOCOL.md 5.1), which ``vllm bench serve`` reads as ``prompt_tokens``.

Errors on these paths are in OpenAI's shape, ``{"error": {"message", "type",
"param", "code"}}``, with the gateway's statuses (gateway/errors.py), so the
SDK raises ``NotFoundError``, ``BadRequestError``, ``InternalServerError``...
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
from aiohttp import web

from gateway.catalog import fleet_stats
from gateway.config import GatewayConfig
from gateway.dialects import Dialect, require_task
from gateway.errors import ApiError, ErrorShape, bad_request
from gateway.inference import call_of, run, with_tokens
from gateway.openapi_parts import (
    BROKER_QUERY_ERRORS,
    EXAMPLE_MODEL,
    PROMPT_NAME,
    TEXTS,
    TOKEN_ID_LISTS,
    answer,
    get,
    inference,
    model_parameter,
    object_schema,
    ref,
)
from gateway.parsing import model_options, parse_inputs, read_json, token_ids, truncate_prompt_tokens
from gateway.responses import json_response
from zbatch.protocol import vocabulary
from zbatch.protocol.vocabulary import EMBEDDINGS
from zbatch.protocol.wire import MAX_NAME_CHARS

ENCODINGS = ("float", "base64")
OWNER = "zbatch"
# OpenAI's error.type by code, where the status does not say it (invalid_request_error below 500,
# server_error from 500).
ERROR_TYPES = {"unauthorized": "authentication_error"}


def error_answer(error: ApiError) -> tuple[int, Any]:
    """OpenAI's ``{"error": {"message", "type", "param", "code"}}``, with the gateway's status."""
    kind = ERROR_TYPES.get(error.code) or ("server_error" if error.status >= 500 else "invalid_request_error")
    return error.status, {"error": {"message": error.message, "type": kind, "param": error.param,
                                    "code": error.code}}


ERRORS = ErrorShape("OpenAIError", object_schema(["error"], {"error": object_schema(
    ["message", "type", "param", "code"], {"message": {"type": "string"}, "type": {"type": "string"},
                                           "param": {"type": "string", "nullable": True},
                                           "code": {"type": "string"}})}), error_answer)


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}


async def served_models(request: web.Request) -> tuple[list[str], int]:
    """The names of the models a worker serves now, sorted, and when the oldest broker started (Unix time)."""
    stats = await fleet_stats(request)
    names = sorted(name for name, figures in stats.get("models", {}).items() if figures.get("workers", 0) > 0)
    return names, int(time.time() - float(stats.get("uptime_s", 0.0)))


async def get_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{"object": "list", "data": [model, ...]}``."""
    names, created = await served_models(request)
    return json_response({"object": "list", "data": [model_object(name, created) for name in names]})


async def get_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``: the model, or 404 if no worker serves it."""
    model = request.match_info["model"]
    names, created = await served_models(request)
    if model not in names:
        raise ApiError("unknown_model", f"no worker serves the model {model!r}; GET /v1/models lists those served",
                       param="model")
    return json_response(model_object(model, created))


def parse_embeddings(body: dict[str, Any]) -> tuple[str, list[Any], str, dict[str, Any]]:
    """An embeddings request: its model, its inputs (texts, or arrays of token ids), its ``encoding_format`` and
    the model's parameters."""
    model = body.get("model")
    if not isinstance(model, str) or not 1 <= len(model) <= MAX_NAME_CHARS:
        raise bad_request(f'"model" must be a string of 1 to {MAX_NAME_CHARS} characters', param="model")
    value = body.get("input")
    inputs: list[Any]
    if isinstance(value, list) and value and not isinstance(value[0], str):
        inputs = token_ids(value, "input")  # the model's own ids, special tokens included (PROTOCOL.md 5.2)
    else:
        inputs, _ = parse_inputs(body, "input")
    truncate_prompt_tokens(body)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise bad_request('"encoding_format" must be "float" or "base64"', param="encoding_format")
    return model, inputs, encoding, model_options(body, (vocabulary.DIMENSIONS, vocabulary.PROMPT_NAME))


def encode_embedding(output: Any, encoding: str) -> Any:
    """One embedding as OpenAI sends it: as it is for "float", little-endian float32 bytes in base64 for "base64"."""
    if encoding == "base64":
        return base64.b64encode(np.asarray(output, dtype="<f4").tobytes()).decode("ascii")
    return output  # json_response writes numpy arrays itself


async def post_embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: one embedding per input, in order, and the tokens they took."""
    model, inputs, encoding, parameters = parse_embeddings(await read_json(request))
    call = call_of(request)
    require_task(model, await call.task_of(model), {EMBEDDINGS}, "POST /v1/embeddings")
    texts = [each for each in inputs if isinstance(each, str)]  # the length limit's; the body's size bounds ids
    result = await run(call, model, inputs, parameters, texts=texts)
    data = [{"object": "embedding", "index": index, "embedding": encode_embedding(output, encoding)}
            for index, output in enumerate(result.outputs)]
    tokens = result.total_tokens or 0
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return with_tokens(json_response({"object": "list", "data": data, "model": model, "usage": usage}), result)


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    return ["POST /v1/embeddings"] if task == EMBEDDINGS else []


SCHEMAS: dict[str, Any] = {
    ERRORS.schema_name: ERRORS.schema,
    "OpenAIModel": object_schema(["id", "object", "created", "owned_by"], {
        "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"}, "owned_by": {"type": "string"}}),
    "OpenAIModelList": object_schema(["object", "data"], {"object": {"type": "string", "enum": ["list"]},
                                                         "data": {"type": "array", "items": ref("OpenAIModel")}}),
    "EmbeddingsRequest": {
        "type": "object", "required": ["model", "input"], "example": {"model": EXAMPLE_MODEL, "input": "hello"},
        "properties": {"model": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS},
                       "input": {"oneOf": [*TEXTS["oneOf"], *TOKEN_ID_LISTS["oneOf"]],
                                 "description": "Texts, or the model's token ids as /tokenize gives them"},
                       "encoding_format": {"type": "string", "enum": list(ENCODINGS), "default": "float"},
                       "dimensions": {"type": "integer", "minimum": 1,
                                      "description": "Only the first N numbers, re-normalised"},
                       "user": {"type": "string"}, **PROMPT_NAME,
                       "truncate_prompt_tokens": {"type": "integer", "enum": [-1], "nullable": True,
                                                  "description": "vLLM's: -1 only (cut each input at the model's "
                                                                 "maximum length, as always)"}},
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
}
PATHS: dict[str, Any] = {
    "/v1/models": get("OpenAI: the models a worker serves", answer("Models", ref("OpenAIModelList")),
                      *BROKER_QUERY_ERRORS, shape=ERRORS),
    "/v1/models/{model}": get("OpenAI: one model a worker serves", answer("The model", ref("OpenAIModel")),
                              *BROKER_QUERY_ERRORS, "unknown_model", shape=ERRORS,
                              parameters=(model_parameter(EXAMPLE_MODEL),)),
    "/v1/embeddings": inference("OpenAI: embeddings, with usage from the model's token counts",
                                {"application/json": {"schema": ref("EmbeddingsRequest")}},
                                answer("Embeddings in input order", ref("EmbeddingsResponse"), tokens=True),
                                shape=ERRORS),
}

DIALECT = Dialect(
    name="openai", title="OpenAI",
    routes=(web.post("/v1/embeddings", post_embeddings), web.get("/v1/models", get_models),
            web.get("/v1/models/{model:.+}", get_model)),
    errors=ERRORS, error_prefixes=("/v1/",), openapi_paths=PATHS, openapi_schemas=SCHEMAS, answers=answers,
    order=20,
)
