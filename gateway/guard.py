"""API keys and the in-flight limit: the gateway's first two checks, around reading the body.

Keys: with ``api_keys_file`` set, every endpoint but ``/healthz`` (and ``/metrics``
unless ``protect_metrics``) needs ``Authorization: Bearer KEY``.  The file holds
one key per line (blank lines and ``#`` comments are ignored); only the SHA-256
digests are kept, and a presented key's digest is compared with every stored
one with :func:`hmac.compare_digest`, never stopping early, so the answer's
timing says nothing about which key, or which prefix, came close.

Keys are checked before the body is read: a caller without one costs no read.

In flight: a middleware counts the requests being answered in an
:class:`InFlight` that the gRPC service (gateway/kserve_grpc/) shares; past
``max_connections`` the next one is answered 503 ``overloaded`` with
``Retry-After``.  A request is counted only once its whole body is in: it
must arrive within ``body_timeout_ms``, or the answer is 408
``request_timeout`` and the connection is closed.  So a client that sends
its body slowly holds a connection, bounded by ``max_open_connections`` and
that timeout (gateway/connections.py), but never a slot of this limit that
the requests ready to run need.  A body larger than ``max_body_bytes`` is
refused 413 from its declared length, unread, or once that much has arrived.

Both raise aiohttp's HTTP errors, which the JSON error middleware turns into
the usual ``{"error": {...}}`` answer with the headers kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from pathlib import Path

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

OPEN_PATHS = frozenset({"/healthz"})  # liveness must not depend on a key
UNCOUNTED_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json"})  # cheap, and needed under overload
RETRY_AFTER_S = 1
CHALLENGE = 'Bearer realm="zbatch"'


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def read_api_keys(path: str) -> tuple[bytes, ...]:
    """SHA-256 digests of the keys in ``path``: one per line, blank lines and ``# comments`` skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return tuple(_digest(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#"))


def check_api_keys_file(path: str) -> str | None:
    """A settings check: an empty value turns keys off; a file must be readable and hold a key."""
    if not path:
        return None
    try:
        keys = read_api_keys(path)
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read the API keys: {getattr(exc, 'strerror', None) or exc}"
    return None if keys else "the file holds no API key (one per line; # starts a comment)"


class ApiKeys:
    """The accepted keys, as digests only."""

    def __init__(self, digests: tuple[bytes, ...]) -> None:
        self._digests = digests

    def allows(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        presented = _digest(token.strip())
        matched = False
        for digest in self._digests:  # every digest, always: constant time whatever matches
            matched |= hmac.compare_digest(digest, presented)
        return matched


def require_api_key(keys: ApiKeys, protect_metrics: bool) -> Middleware:
    open_paths = OPEN_PATHS if protect_metrics else OPEN_PATHS | {"/metrics"}

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in open_paths and not keys.allows(request.headers.get(hdrs.AUTHORIZATION)):
            raise web.HTTPUnauthorized(
                text="this gateway needs an API key: send the header 'Authorization: Bearer KEY'",
                headers={hdrs.WWW_AUTHENTICATE: CHALLENGE},
            )
        return await handler(request)

    return authenticate


async def read_in_time(request: web.Request, max_bytes: int, timeout_s: float) -> None:
    """Read the whole body within ``timeout_s`` (``request.read()`` returns it from then on).

    413 for a declared length over ``max_bytes``, before reading; 408 if the body is late.
    """
    length = request.content_length
    if length is not None and length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_bytes, length, text=f"the body has {length} bytes; the limit is "
                                                                     f"{max_bytes}")
    if request.content.is_eof():  # the whole body came with the headers, as most do: no timer to arm
        await request.read()
        return
    try:
        async with asyncio.timeout(timeout_s):
            await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the body did not arrive within {timeout_s:g} s of the headers; send it at once, "
                 "on a faster connection, or in smaller requests"
        ) from None


class InFlight:
    """The requests this process is answering, over every protocol, counted once their body is in; at most ``limit``.

    Callers check :meth:`full`, then add one to ``count`` and take it off when answered.
    """

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def full(self) -> bool:
        return self.count >= self.limit

    def refusal(self) -> str:
        return f"the gateway is answering {self.limit} requests already; retry shortly"


def limit_in_flight(in_flight: InFlight, max_body_bytes: int, body_timeout_s: float) -> Middleware:
    @web.middleware
    async def shed(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in UNCOUNTED_PATHS:
            return await handler(request)
        if request.body_exists:
            await read_in_time(request, max_body_bytes, body_timeout_s)
        if in_flight.full():
            raise web.HTTPServiceUnavailable(text=in_flight.refusal(), headers={hdrs.RETRY_AFTER: str(RETRY_AFTER_S)})
        in_flight.count += 1
        try:
            return await handler(request)
        finally:
            in_flight.count -= 1

    return shed
