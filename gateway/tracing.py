"""Request ids and the access log.

Every request gets an id: the caller's ``X-Request-ID`` when it is 1 to 128
printable ASCII characters, else a fresh unique one.  It goes back in the
response's ``X-Request-ID`` (errors too), to the broker as the request's
``trace`` (so broker and worker log lines carry it), and into one access log
line per request.  aiohttp's own access log is off: this one has the id.
"""

from __future__ import annotations

import itertools
import logging
import os
import time

from aiohttp import web
from aiohttp.typedefs import Handler

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID_CHARS = 128
REQUEST_ID = web.RequestKey("request_id", str)
# Status logged for a request whose caller hung up before the answer (as nginx does).
CLIENT_CLOSED = 499

access_log = logging.getLogger("zbatch.gateway.access")


# Fresh ids: 32 hex digits like a uuid4, a random prefix per process and a counter, as unique
# for this purpose (one gateway never repeats one, two share a prefix with odds of 2**-64) and
# without a system call and an object per request.
_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count()


def request_id_from(value: str | None) -> str:
    """The caller's id if it is printable ASCII of a sane length; a new one otherwise."""
    if value and len(value) <= MAX_REQUEST_ID_CHARS and all(" " <= c <= "~" for c in value):
        return value
    return f"{_ID_PREFIX}{next(_id_counter):016x}"


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request[REQUEST_ID] = request_id_from(request.headers.get(REQUEST_ID_HEADER))
    started = time.perf_counter()
    status = CLIENT_CLOSED
    try:
        response = await handler(request)
        status = response.status
        response.headers[REQUEST_ID_HEADER] = request_id
        return response
    except web.HTTPException as exc:  # the JSON error middleware lets only non-errors through
        status = exc.status
        exc.headers[REQUEST_ID_HEADER] = request_id
        raise
    finally:
        if access_log.isEnabledFor(logging.INFO):  # off by default; its arguments alone cost microseconds
            access_log.info('%s "%s %s" %d %.1f ms', request.remote, request.method, request.path_qs, status,
                            (time.perf_counter() - started) * 1000, extra={"request_id": request_id})
