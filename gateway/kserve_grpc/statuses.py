"""The gRPC status of each of the gateway's error codes (gateway/errors.py), and how long to wait before a retry.

gRPC has its own small set of codes; each error code of the table maps to
one, so a tritonclient user reads the same failure the HTTP dialects
answer: a bad input is ``INVALID_ARGUMENT``, an unknown model ``NOT_FOUND``,
overload ``RESOURCE_EXHAUSTED`` with the wait in the trailing metadata, a
deadline ``DEADLINE_EXCEEDED``, a worker or broker that cannot answer now
``UNAVAILABLE`` (gRPC clients retry it), a failure that retrying will not
mend ``INTERNAL``.  The message is the HTTP answer's.

Overload's trailing metadata carries the wait twice: ``retry-after`` in whole
seconds, as HTTP's header, and ``grpc-retry-pushback-ms`` in milliseconds,
which a gRPC client with a retry policy obeys (gRFC A6).
"""

from __future__ import annotations

import math

import grpc
from aiohttp import hdrs

from gateway.errors import ApiError

Code = grpc.StatusCode
STATUSES: dict[str, Code] = {
    "bad_request": Code.INVALID_ARGUMENT,
    "input_too_long": Code.INVALID_ARGUMENT,
    "wrong_task": Code.INVALID_ARGUMENT,
    "unauthorized": Code.UNAUTHENTICATED,
    "unknown_model": Code.NOT_FOUND,
    "not_found": Code.UNIMPLEMENTED,  # no such method: what gRPC itself answers
    "method_not_allowed": Code.UNIMPLEMENTED,
    "request_timeout": Code.DEADLINE_EXCEEDED,  # the request message did not arrive in time
    "payload_too_large": Code.RESOURCE_EXHAUSTED,  # as gRPC answers a message over its limit
    "too_many_inputs": Code.INVALID_ARGUMENT,
    "unsupported_media_type": Code.INVALID_ARGUMENT,
    "internal_error": Code.INTERNAL,
    "worker_error": Code.INTERNAL,  # this input makes the model fail: retrying does not help
    "worker_lost": Code.UNAVAILABLE,  # retry
    "upstream_error": Code.INTERNAL,
    "overloaded": Code.RESOURCE_EXHAUSTED,
    "no_worker": Code.UNAVAILABLE,
    "broker_unavailable": Code.UNAVAILABLE,
    "deadline_exceeded": Code.DEADLINE_EXCEEDED,
}
RETRY_AFTER = "retry-after"
RETRY_PUSHBACK_MS = "grpc-retry-pushback-ms"


def status_of(error: ApiError) -> Code:
    return STATUSES[error.code]


def retry_metadata(error: ApiError, retry_after_ms: int | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that says when to retry, for an answer that has a wait (overload); else none.

    ``retry_after_ms``: the broker's estimate, when it gave one; else the ``Retry-After`` of the HTTP answer.
    """
    if retry_after_ms is None:
        seconds = error.headers.get(hdrs.RETRY_AFTER)
        if seconds is None:
            return ()
        retry_after_ms = int(seconds) * 1000
    return ((RETRY_AFTER, str(max(1, math.ceil(retry_after_ms / 1000)))), (RETRY_PUSHBACK_MS, str(retry_after_ms)))
