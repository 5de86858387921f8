"""The pieces the OpenAPI document (gateway/openapi.py) is built of: answers, error answers, operations.

Error answers come from the error table (gateway/errors.py) in the
:class:`~gateway.errors.ErrorShape` of the path's dialect: its statuses and
its error schema.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs

from gateway.errors import ERRORS, ZBATCH_ERRORS, ErrorCode, ErrorShape
from gateway.inference import TOKENS_HEADER
from gateway.parsing import MAX_TOKEN_ID, PRIORITY_HEADER, TIMEOUT_HEADER
from gateway.tracing import REQUEST_ID_HEADER
from zbatch.protocol.wire import MAX_NAME_CHARS

# An inference request can end in any error that belongs to an operation.
INFERENCE_ERRORS = tuple(error.code for error in ERRORS.values() if error.per_operation)
BROKER_QUERY_ERRORS = ("unauthorized", "overloaded", "broker_unavailable")
# The headers gateway/parsing.py reads, by the name of their parameter under components.
REQUEST_HEADERS = {TIMEOUT_HEADER: "RequestTimeout", PRIORITY_HEADER: "Priority"}
HEADER_SCHEMAS: dict[str, dict[str, str]] = {str(hdrs.RETRY_AFTER): {"type": "integer"}}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def answer(description: str, schema: dict[str, Any], media: str = "application/json", *,
           tokens: bool = False) -> dict[str, Any]:
    """A response; ``tokens``: it carries X-Tokens (inference)."""
    headers: dict[str, Any] = {REQUEST_ID_HEADER: {"$ref": "#/components/headers/RequestId"}}
    if tokens:
        headers[TOKENS_HEADER] = {"$ref": "#/components/headers/Tokens"}
    return {"description": description, "headers": headers, "content": {media: {"schema": schema}}}


def _when(error: ErrorCode) -> str:
    """What the document says of one code: when it happens, the code, and the headers it comes with."""
    with_headers = "".join(f", with {name}" for name in error.headers)
    return f"{error.when} (`{error.code}`{with_headers})"


def errors_for(*codes: str, shape: ErrorShape = ZBATCH_ERRORS) -> dict[str, Any]:
    """The error responses of an operation that can end in ``codes``, one per status, in ``shape``."""
    by_status: dict[str, list[ErrorCode]] = {}
    for error in sorted((ERRORS[code] for code in codes), key=shape.status):
        by_status.setdefault(str(shape.status(error)), []).append(error)
    responses = {}
    for status, errors in by_status.items():
        when = "; ".join(map(_when, errors))
        response = answer(when[0].upper() + when[1:], ref(shape.schema_name))
        for error in errors:
            for name, says in error.headers.items():
                response["headers"][name] = {"description": f"{says} (with `{error.code}`)",
                                             "schema": HEADER_SCHEMAS.get(name, {"type": "string"})}
        responses[status] = response
    return responses


def inference(summary: str, body: dict[str, Any], ok: dict[str, Any], *parameters: dict[str, Any],
              shape: ErrorShape = ZBATCH_ERRORS) -> dict[str, Any]:
    """An inference operation: the request headers, ``body`` (media types), ``ok`` and every error."""
    headers = [{"$ref": f"#/components/parameters/{name}"} for name in ("RequestId", *REQUEST_HEADERS.values())]
    return {"post": {
        "summary": summary,
        "parameters": [*headers, *parameters],
        "requestBody": {"required": True, "content": body},
        "responses": {"200": ok, **errors_for(*INFERENCE_ERRORS, shape=shape)},
    }}


def get(summary: str, ok: dict[str, Any], *errors: str, parameters: tuple[dict[str, Any], ...] = (),
        shape: ErrorShape = ZBATCH_ERRORS) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": [{"$ref": "#/components/parameters/RequestId"}, *parameters],
                    "responses": {"200": ok, **errors_for(*errors, shape=shape)}}}


def json_body(schema: str, example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": ref(schema)}
    if example is not None:
        media["example"] = example
    return {"application/json": media}


def model_parameter(example: str) -> dict[str, Any]:
    return {"name": "model", "in": "path", "required": True, "example": example,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}


def object_schema(required: list[str], properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """An object schema (OpenAPI 3.0 wants no empty ``required``)."""
    return {"type": "object", **({"required": required} if required else {}), "properties": properties, **more}


TEXT = {"type": "string", "minLength": 1}
TEXTS = {"oneOf": [TEXT, {"type": "array", "minItems": 1, "items": TEXT}]}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}}
TOKEN_ID_LISTS = {"oneOf": [TOKEN_IDS, {"type": "array", "minItems": 1, "items": TOKEN_IDS}]}  # one input, or several
NUMBERS = {"type": "array", "items": {"type": "number"}}
FLAG = {"type": "boolean", "nullable": True}
DIRECTION = {"type": "string", "enum": ["left", "right", "Left", "Right"], "default": "right"}
TRUNCATION = {"truncate": {**FLAG, "description": "Cut inputs longer than the model's maximum (default true); "
                                                  "false refuses them"},
              "truncation_direction": DIRECTION}
PROMPT_NAME = {"prompt_name": {"type": "string", "nullable": True, "minLength": 1,
                               "description": "A prompt of the model's config_sentence_transformers.json, put "
                                              "before each text (default: the worker's --default-prompt-name)"}}
EXAMPLE_MODEL = "all-MiniLM-L6-v2"
