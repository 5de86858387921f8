"""The pieces the OpenAPI document (gateway/openapi.py) is built of: answers, error answers, operations.

Error answers come from the error table (gateway/errors.py) in the dialect
of their path: its statuses (TEI's column for TEI) and its error schema.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs

from gateway.dialects import Dialect
from gateway.errors import ERRORS, ErrorCode
from gateway.inference import TOKENS_HEADER
from gateway.parsing import PRIORITY_HEADER, TIMEOUT_HEADER
from gateway.tracing import REQUEST_ID_HEADER
from zbatch.protocol.wire import MAX_NAME_CHARS

# An inference request can end in any error that belongs to an operation.
INFERENCE_ERRORS = tuple(error.code for error in ERRORS.values() if error.per_operation)
BROKER_QUERY_ERRORS = ("unauthorized", "overloaded", "broker_unavailable")
# The headers gateway/parsing.py reads, by the name of their parameter under components.
REQUEST_HEADERS = {TIMEOUT_HEADER: "RequestTimeout", PRIORITY_HEADER: "Priority"}
HEADER_SCHEMAS: dict[str, dict[str, str]] = {str(hdrs.RETRY_AFTER): {"type": "integer"}}
ERROR_SCHEMAS = {Dialect.ZBATCH: "Error", Dialect.OPENAI: "OpenAIError", Dialect.TEI: "TEIError",
                 Dialect.KSERVE: "KServeError"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def answer(description: str, schema: dict[str, Any], media: str = "application/json", *,
           tokens: bool = False) -> dict[str, Any]:
    """A response; ``tokens``: it carries X-Tokens (inference)."""
    headers: dict[str, Any] = {REQUEST_ID_HEADER: {"$ref": "#/components/headers/RequestId"}}
    if tokens:
        headers[TOKENS_HEADER] = {"$ref": "#/components/headers/Tokens"}
    return {"description": description, "headers": headers, "content": {media: {"schema": schema}}}


def status_in(error: ErrorCode, dialect: Dialect) -> int:
    """The status ``error`` is answered with on a path of ``dialect``."""
    return error.tei_answer[0] if dialect is Dialect.TEI else error.status


def _when(error: ErrorCode) -> str:
    """What the document says of one code: when it happens, the code, and the headers it comes with."""
    with_headers = "".join(f", with {name}" for name in error.headers)
    return f"{error.when} (`{error.code}`{with_headers})"


def errors_for(*codes: str, dialect: Dialect = Dialect.ZBATCH) -> dict[str, Any]:
    """The error responses of an operation that can end in ``codes``, one per status, in ``dialect``'s shape."""
    by_status: dict[str, list[ErrorCode]] = {}
    for error in sorted((ERRORS[code] for code in codes), key=lambda error: status_in(error, dialect)):
        by_status.setdefault(str(status_in(error, dialect)), []).append(error)
    responses = {}
    for status, errors in by_status.items():
        when = "; ".join(map(_when, errors))
        response = answer(when[0].upper() + when[1:], ref(ERROR_SCHEMAS[dialect]))
        for error in errors:
            for name, says in error.headers.items():
                response["headers"][name] = {"description": f"{says} (with `{error.code}`)",
                                             "schema": HEADER_SCHEMAS.get(name, {"type": "string"})}
        responses[status] = response
    return responses


def inference(summary: str, body: dict[str, Any], ok: dict[str, Any], *parameters: dict[str, Any],
              dialect: Dialect = Dialect.ZBATCH) -> dict[str, Any]:
    """An inference operation: the request headers, ``body`` (media types), ``ok`` and every error."""
    headers = [{"$ref": f"#/components/parameters/{name}"} for name in ("RequestId", *REQUEST_HEADERS.values())]
    return {"post": {
        "summary": summary,
        "parameters": [*headers, *parameters],
        "requestBody": {"required": True, "content": body},
        "responses": {"200": ok, **errors_for(*INFERENCE_ERRORS, dialect=dialect)},
    }}


def get(summary: str, ok: dict[str, Any], *errors: str, parameters: tuple[dict[str, Any], ...] = (),
        dialect: Dialect = Dialect.ZBATCH) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": [{"$ref": "#/components/parameters/RequestId"}, *parameters],
                    "responses": {"200": ok, **errors_for(*errors, dialect=dialect)}}}


def json_body(schema: str, example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": ref(schema)}
    if example is not None:
        media["example"] = example
    return {"application/json": media}


def model_parameter(example: str) -> dict[str, Any]:
    return {"name": "model", "in": "path", "required": True, "example": example,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}
