"""The gateway's error vocabulary, and the middleware that answers every failure in it.

:data:`ERRORS` is the one table of error codes: for each, its HTTP status, when
it happens, and which failure it stands for (a :mod:`zbatch.client` exception,
an aiohttp refusal, or a check of the gateway's own).  The JSON errors take
their status and code from it, and ``/openapi.json`` its error enum and the
descriptions of its error responses (gateway/openapi.py), so the two cannot
disagree.

Every failure, ours, the broker's, the worker's or aiohttp's own 404/405/413,
leaves through :func:`json_errors`, never as a traceback, in the
:class:`ErrorShape` of the path's dialect: the gateway's own,
``{"error": {"code": ..., "message": ...}}`` (:data:`ZBATCH_ERRORS`), or the
shape a dialect declares (gateway/dialects/), so that dialect's own client
libraries raise their own typed errors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from gateway import guard
from gateway.tracing import REQUEST_ID
from zbatch.client import (
    BadRequest,
    BrokerUnavailable,
    DeadlineExceeded,
    NoWorker,
    Overloaded,
    UnknownModel,
    WorkerError,
    WorkerLost,
    ZBatchError,
)

log = logging.getLogger("zbatch.gateway")


@dataclass(frozen=True)
class ErrorCode:
    """One ``error.code`` the gateway answers with.

    ``client_error``: the :mod:`zbatch.client` exception answered with this code.
    ``http_exception``: aiohttp's refusals (no route, wrong method, body too large)
    and the guards' (gateway/guard.py) of this status get this code.
    ``headers``: the response headers that come with it, and what they say.
    ``per_operation``: False for the answers to a path or method that has no
    endpoint, which the document lists in its enum but under no operation.
    ``closes``: the connection is closed once the answer is written, and nothing
    more is read from it (the caller was too slow to wait for the rest).
    A dialect may answer a code with another status (TEI's 422 for a bad request).
    """

    code: str
    status: int
    when: str
    client_error: type[ZBatchError] | None = None
    http_exception: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    per_operation: bool = True
    closes: bool = False


RETRY_AFTER: dict[str, str] = {str(hdrs.RETRY_AFTER): "Seconds to wait before retrying"}
CHALLENGE: dict[str, str] = {str(hdrs.WWW_AUTHENTICATE): f"`{guard.CHALLENGE}`"}
CLOSE: dict[str, str] = {str(hdrs.CONNECTION): "`close`: the gateway closes the connection after this answer"}

ERRORS: dict[str, ErrorCode] = {
    error.code: error
    for error in (
        ErrorCode("bad_request", 400, "malformed JSON, wrong types, empty input, bad parameters or a bad header",
                  client_error=BadRequest, http_exception=True),
        ErrorCode("input_too_long", 400, "an input is longer than the gateway's limit"),
        ErrorCode("wrong_task", 400, "the model does another task than the route needs; the message names the "
                  "routes that answer the model's task"),
        ErrorCode("unauthorized", 401, "the gateway has API keys and the request carries none of them",
                  http_exception=True, headers=CHALLENGE),
        ErrorCode("unknown_model", 404, "no worker serves the model", client_error=UnknownModel),
        ErrorCode("not_found", 404, "no endpoint at this path", http_exception=True, per_operation=False),
        ErrorCode("method_not_allowed", 405, "the path has no endpoint for this method; Allow lists those it has",
                  http_exception=True, per_operation=False),
        ErrorCode("request_timeout", 408, "the body did not arrive within the gateway's body timeout",
                  http_exception=True, headers=CLOSE, closes=True),
        ErrorCode("payload_too_large", 413, "the body is larger than the gateway's limit", http_exception=True),
        ErrorCode("too_many_inputs", 413, "the body holds more inputs than the gateway's limit"),
        ErrorCode("unsupported_media_type", 415, "wrong Content-Type", http_exception=True),
        ErrorCode("internal_error", 500, "the gateway failed unexpectedly; its log has the details (the only 500: "
                  "every failure of a worker or the broker is a 502 or 503)"),
        ErrorCode("worker_error", 502, "the model failed on this input, or an input made workers crash; the other "
                  "inputs of its batch still succeed", client_error=WorkerError),
        ErrorCode("worker_lost", 502, "the worker died, or answered with a status it may not send, and the "
                  "broker's retry budget is spent (or no other worker serves the model); the message names the "
                  "worker where one failed it; retry", client_error=WorkerLost),
        ErrorCode("upstream_error", 502, "the broker or a worker answered something the gateway cannot use (a "
                  "status it does not know, an unreadable answer)", client_error=ZBatchError),
        ErrorCode("overloaded", 503, "the broker predicts the request would not be answered within its deadline "
                  "(or its backlog's memory bound is reached), or the gateway is answering as many requests, or "
                  "holds as many connections, as it takes at once; Retry-After says when room is expected",
                  client_error=Overloaded,
                  http_exception=True, headers=RETRY_AFTER),
        ErrorCode("no_worker", 503, "the model is known but no worker serves it right now", client_error=NoWorker),
        ErrorCode("broker_unavailable", 503, "the broker is not reachable, or is draining",
                  client_error=BrokerUnavailable),
        ErrorCode("deadline_exceeded", 504, "the deadline passed first", client_error=DeadlineExceeded),
    )
}

# The table read the two ways the middleware needs it.
BROKER_ERRORS: dict[type[ZBatchError], tuple[int, str]] = {
    error.client_error: (error.status, error.code) for error in ERRORS.values() if error.client_error
}
HTTP_ERROR_CODES: dict[int, str] = {error.status: error.code for error in ERRORS.values() if error.http_exception}
CLOSING_CODES = frozenset(error.code for error in ERRORS.values() if error.closes)


class ApiError(Exception):
    """A failure the gateway answers on purpose: a code of :data:`ERRORS`, with that code's status.

    ``status`` overrides the table's only for aiohttp refusals that have no code of their own.
    ``param``: the request field at fault, when one is (OpenAI's shape says it).
    """

    def __init__(
        self, code: str, message: str, headers: Mapping[str, str] | None = None, *, status: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = ERRORS[code].status if status is None else status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.param = param


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError("bad_request", message, param=param)


def from_broker(exc: ZBatchError) -> ApiError:
    """The HTTP answer for a failed request; overload carries ``Retry-After`` in whole seconds."""
    status, code = BROKER_ERRORS.get(type(exc), (500, "internal_error"))
    headers: dict[str, str] = {}
    if isinstance(exc, Overloaded) or exc.retry_after_ms is not None:
        headers[hdrs.RETRY_AFTER] = str(max(1, math.ceil((exc.retry_after_ms or 0) / 1000)))
    return ApiError(code, exc.message or code.replace("_", " "), headers, status=status)


def from_http(exc: web.HTTPException, request: web.Request) -> ApiError:
    """aiohttp's own refusals (no route, wrong method, body too large) in our error shape."""
    if exc.status == 404:
        message = f"no endpoint at {request.path}"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"{request.method} is not allowed on {request.path}; use {allowed}"
    else:
        message = exc.text or exc.reason
    code = HTTP_ERROR_CODES.get(exc.status, "internal_error" if exc.status >= 500 else "bad_request")
    kept = {str(k): v for k, v in exc.headers.items() if k not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
    return ApiError(code, message, kept, status=exc.status)


@dataclass(frozen=True)
class ErrorShape:
    """How a dialect answers an error: its status and JSON body, and the body's OpenAPI schema.

    ``status``: the status of a code of the table in this dialect (the document lists its errors by it);
    ``answer``: an error's status and body.  An error whose status was overridden (an aiohttp refusal
    without a code of its own) keeps its status in every dialect.
    """

    schema_name: str
    schema: Mapping[str, Any]
    answer: Callable[[ApiError], tuple[int, Any]]
    status: Callable[[ErrorCode], int] = lambda error: error.status


def _zbatch_answer(error: ApiError) -> tuple[int, Any]:
    return error.status, {"error": {"code": error.code, "message": error.message}}


ZBATCH_ERRORS = ErrorShape("Error", {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["code", "message"], "additionalProperties": False,
        "properties": {"code": {"type": "string", "enum": list(ERRORS)},
                       "message": {"type": "string", "description": "What happened and what to do"}},
    }},
}, _zbatch_answer)


def json_errors(shape_of: Callable[[str, str], ErrorShape]) -> Middleware:
    """The middleware that answers every failure below it as JSON in the shape ``shape_of`` gives the path and
    the request's media type; unexpected failures are logged."""

    @web.middleware
    async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            error = exc
        except ZBatchError as exc:
            error = from_broker(exc)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error = from_http(exc, request)
        except Exception:
            log.exception("unexpected error answering %s %s", request.method, request.path,
                          extra={"request_id": request.get(REQUEST_ID, "")})
            error = internal_error()
        status, body = shape_of(request.path, request.content_type).answer(error)
        if error.code in CLOSING_CODES:
            return ClosingResponse(request, text=orjson.dumps(body).decode(), status=status,
                                   headers=error.headers, content_type="application/json")
        return web.Response(body=orjson.dumps(body), status=status, headers=error.headers,
                            content_type="application/json")

    return answer_errors


def internal_error() -> ApiError:
    """The answer to a failure nobody expected (logged where it is caught): no details leave the gateway."""
    return ApiError("internal_error", "internal error; the gateway log has the details")


class ClosingResponse(web.Response):
    """An answer after which the connection is closed at once.

    aiohttp would otherwise keep reading what is left of the request's body,
    for up to its lingering time, before closing: pointless for a body that
    was too slow to wait for.
    """

    def __init__(self, request: web.Request, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._connection = request.protocol
        self.force_close()  # Connection: close

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(data)
        self._connection.force_close()  # the answer is written: the transport sends it, then closes
