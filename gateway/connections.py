"""The gateway's connections: a cap on how many are open, a deadline for each request's headers, the Server header.

aiohttp bounds neither how many connections a server holds nor how long a
client may take over a request's headers: a client sending a byte a second
keeps its connection for as long as it likes, and enough such clients use up
the process's file descriptors, after which nobody else gets in.
:class:`Connection` is aiohttp's own protocol, :class:`aiohttp.web.RequestHandler`,
with three additions made through its public methods:

* Past ``max_open_connections``, a new connection is answered 503
  ``overloaded`` at once, before anything is read, and closed.  The
  connections already open, and the requests on them, go on undisturbed.
  Since the request is never read, a client may see the connection reset
  rather than the answer.
* A connection must deliver a request's complete headers within
  ``header_timeout_ms`` of its opening, or of the first byte of a later
  request; otherwise it is closed.  The wait between two requests is the
  idle timeout instead (aiohttp's ``keepalive_timeout``), so a keep-alive
  connection may sit idle longer than a client may take over its headers.
  The headers are complete once the application sees the request:
  :func:`track_requests`, the outermost middleware, tells the connection.
* Every answer's ``Server`` header is ``zbatch``, without aiohttp's and
  Python's versions: the app's answers get it from :func:`track_requests`,
  aiohttp's own refusals of malformed requests from the connection.

The body has its own deadline, ``body_timeout_ms``: the in-flight guard
(gateway/guard.py) reads the body within it before it counts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import orjson
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.guard import RETRY_AFTER_S
from gateway.tracing import REQUEST_ID_HEADER, request_id_from

SERVER = "zbatch"


class Connections:
    """What the gateway's connections share: the cap, the header deadline, and the counts /metrics shows."""

    def __init__(self, limit: int, header_timeout_s: float) -> None:
        self.limit = limit
        self.header_timeout_s = header_timeout_s
        self.open = 0
        self.refused = 0  # answered 503 at once: the cap was reached
        self.header_timeouts = 0  # closed: a request's headers came too slowly
        body = orjson.dumps({"error": {
            "code": "overloaded",
            "message": f"the gateway has {limit} connections open, as many as it takes; retry shortly",
        }})
        self._refusal_head = (
            f"HTTP/1.1 503 Service Unavailable\r\n{hdrs.SERVER}: {SERVER}\r\n"
            f"{hdrs.CONTENT_TYPE}: application/json; charset=utf-8\r\n{hdrs.CONTENT_LENGTH}: {len(body)}\r\n"
            f"{hdrs.RETRY_AFTER}: {RETRY_AFTER_S}\r\n{hdrs.CONNECTION}: close\r\n"
        ).encode("ascii")
        self._refusal_body = body

    def full(self) -> bool:
        return self.open >= self.limit

    def refusal(self) -> bytes:
        """The whole 503 answer to a connection past the cap, with a request id of its own."""
        request_id = f"{REQUEST_ID_HEADER}: {request_id_from(None)}\r\n\r\n".encode("ascii")
        return self._refusal_head + request_id + self._refusal_body

    def collect(self) -> Iterator[Metric]:
        """The connection metrics, read when Prometheus scrapes (a prometheus_client collector)."""
        yield GaugeMetricFamily("zbatch_gateway_open_connections", "HTTP connections open", value=self.open)
        yield CounterMetricFamily(
            "zbatch_gateway_refused_connections",
            "New connections answered 503 and closed at once, because max_open_connections were open",
            value=self.refused,
        )
        yield CounterMetricFamily(
            "zbatch_gateway_header_timeouts",
            "Connections closed because a request's headers did not arrive within header_timeout_ms",
            value=self.header_timeouts,
        )


class Connection(web.RequestHandler):
    """aiohttp's protocol for one connection, counted against the cap and held to the header deadline.

    ``options`` are :class:`aiohttp.web.RequestHandler`'s (``loop``, ``keepalive_timeout``, ...).
    """

    __slots__ = ("_connections", "_counted", "_header_timer", "_in_request")

    def __init__(self, manager: web.Server, connections: Connections, **options: Any) -> None:
        super().__init__(manager, **options)
        self._connections = connections
        self._counted = False  # refused connections never reach aiohttp
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_request = False  # the app is answering a request from this connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        connections = self._connections
        if connections.full():
            connections.refused += 1
            cast(asyncio.Transport, transport).write(connections.refusal())
            transport.close()
            return
        connections.open += 1
        self._counted = True
        super().connection_made(transport)
        self._expect_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._counted:
            return
        self._counted = False
        self._connections.open -= 1
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._header_timer is None and data:
            if not self._counted:
                return
            self._expect_headers()  # the first bytes of the next request
        super().data_received(data)

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """aiohttp's own answer to a malformed request, or to a failure outside the app, without versions."""
        response = super().handle_error(request, status, exc, message)
        response.headers[hdrs.SERVER] = SERVER
        return response

    def request_started(self) -> None:
        """The application has a request from this connection: its headers came in time."""
        self._in_request = True
        self._cancel_deadline()

    def request_finished(self) -> None:
        """The application has answered; the next bytes begin a new request, and its header deadline."""
        self._in_request = False

    def _expect_headers(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self._connections.header_timeout_s, self._headers_late)

    def _cancel_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._in_request:
            self._connections.header_timeouts += 1
            self.force_close()


@web.middleware
async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the request's connection that its headers are in, and when its answer is ready; name the server."""
    protocol = request.protocol
    connection = protocol if isinstance(protocol, Connection) else None  # None: served another way (tests)
    if connection is not None:
        connection.request_started()
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # the JSON error middleware lets only non-errors through
        exc.headers[hdrs.SERVER] = SERVER
        raise
    finally:
        if connection is not None:
            connection.request_finished()
    response.headers[hdrs.SERVER] = SERVER
    return response
