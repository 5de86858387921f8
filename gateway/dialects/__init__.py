"""The HTTP dialects the gateway speaks, one module each, and what each one declares.

Every module of this package is a dialect and defines ``DIALECT``, a
:class:`Dialect`: its routes, the paths whose errors take its
:class:`~gateway.errors.ErrorShape`, its part of the OpenAPI document, and
which of its routes answer a model of a task (for ``GET /models`` and the
``wrong_task`` messages: :func:`require_task`).  The application mounts what :func:`declared`
finds, the error middleware asks :func:`error_shape_of`, and the document
(gateway/openapi.py) gathers the parts, so a new dialect is one new module
and its tests.  A dialect imports the gateway's shared modules, never
another dialect (tests/test_layout.py).

Two dialects may answer one route, told apart by the request's media type:
a :class:`Claim` takes the requests of its media types on another dialect's
route (TEI's JSON at the gateway's ``POST /``), which :func:`all_routes`
mounts once, and whose errors then take the claiming dialect's shape.

* :mod:`~gateway.dialects.zbatch`: the gateway's own, ``POST /``, health, readiness, models, statistics.
* :mod:`~gateway.dialects.huggingface`: the Hugging Face Inference API shapes of ``POST /models/{model}``.
* :mod:`~gateway.dialects.openai`: OpenAI's ``/v1/models`` and ``/v1/embeddings``.
* :mod:`~gateway.dialects.tei`: Hugging Face Text Embeddings Inference, and JSON at ``POST /`` as TEI's root.
* :mod:`~gateway.dialects.cohere`: Cohere's rerank (``/v1/rerank``, ``/v2/rerank``), which Jina's and infinity's
  clients speak too.
* :mod:`~gateway.dialects.kserve`: the Open Inference Protocol (KServe v2, Triton) over HTTP under ``/v2``.

The KServe v2 gRPC service (gateway/kserve_grpc/) is a protocol of its own port,
not a set of HTTP routes; it shares the KServe tensors of each task with the
HTTP dialect through gateway/signatures.py.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import ZBATCH_ERRORS, ApiError, ErrorShape

if TYPE_CHECKING:
    from gateway.config import GatewayConfig

# (task or None for unknown, the model or None for any, the gateway's settings or None for any) -> routes
RoutesFor = Callable[["str | None", "str | None", "GatewayConfig | None"], list[str]]


def no_routes(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    return []


@dataclass(frozen=True)
class Claim:
    """The requests of ``media_types`` on another dialect's route (``method`` ``path``), which ``handler`` answers."""

    method: str
    path: str
    media_types: frozenset[str]
    handler: Handler


@dataclass(frozen=True)
class Dialect:
    """What one dialect module declares.

    ``name``: its key in ``GET /models``' ``dialects``; ``title``: how messages name it.
    ``routes``: its aiohttp routes, in the order they must be tried.
    ``error_paths`` and ``error_prefixes``: the paths whose errors, a 404 or 405 included,
    are answered in ``errors``; an exact path wins over a prefix, a longer prefix over a shorter.
    ``openapi_paths`` and ``openapi_schemas``: its part of ``/openapi.json``.
    ``answers``: its routes that answer a model of a task (:data:`RoutesFor`).
    ``claims``: the requests it answers on other dialects' routes, by media type (:class:`Claim`).
    ``order``: where its routes go among the dialects' (lower first).
    """

    name: str
    title: str
    routes: Sequence[web.RouteDef]
    errors: ErrorShape = ZBATCH_ERRORS
    error_paths: frozenset[str] = frozenset()
    error_prefixes: tuple[str, ...] = ()
    openapi_paths: Mapping[str, Any] = field(default_factory=dict)
    openapi_schemas: Mapping[str, Any] = field(default_factory=dict)
    answers: RoutesFor = no_routes
    claims: Sequence[Claim] = ()
    order: int = 50


@functools.cache
def declared() -> tuple[Dialect, ...]:
    """Every dialect of this package, in route order (loaded on the first call)."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        dialect = getattr(importlib.import_module(f"{__name__}.{module.name}"), "DIALECT", None)
        if not isinstance(dialect, Dialect):
            raise TypeError(f"{__name__}.{module.name} is in the dialects package but declares no DIALECT")
        found.append(dialect)
    return tuple(sorted(found, key=lambda dialect: (dialect.order, dialect.name)))


def error_shape_of(path: str, media_type: str = "") -> ErrorShape:
    """The error shape a request answers in: that of the dialect claiming its path and media type
    (:class:`Claim`), else its path's dialect's (see :class:`Dialect`), else the gateway's own."""
    claimed = _claimed().get(path)
    if claimed is not None and media_type in claimed[1].media_types:
        return claimed[0].errors
    exact, prefixes = _error_owners()
    shape = exact.get(path)
    if shape is not None:
        return shape
    for prefix, owner in prefixes:  # longest first
        if path.startswith(prefix):
            return owner
    return ZBATCH_ERRORS


@functools.cache
def _error_owners() -> tuple[dict[str, ErrorShape], list[tuple[str, ErrorShape]]]:
    dialects = declared()
    exact = {path: dialect.errors for dialect in dialects for path in dialect.error_paths}
    prefixes = [(prefix, dialect.errors) for dialect in dialects for prefix in dialect.error_prefixes]
    return exact, sorted(prefixes, key=lambda owned: -len(owned[0]))


def routes_by_dialect(task: str | None, model: str | None = None,
                      config: GatewayConfig | None = None) -> dict[str, list[str]]:
    """Per dialect, its routes that answer ``model`` (any model if None) of ``task`` under ``config``."""
    answering = {dialect.name: dialect.answers(task, model, config) for dialect in declared()}
    return {name: routes for name, routes in sorted(answering.items()) if routes}


def task_routes(task: str) -> str:
    """In words, where a model of ``task`` is answered, for an error message."""
    titles = {dialect.name: dialect.title for dialect in declared()}
    return "; ".join(f"{titles[name]}'s {', '.join(routes)}" for name, routes in routes_by_dialect(task).items())


def require_task(model: str, task: str | None, needed: Collection[str], route: str, setting: str = "") -> None:
    """Raise ``wrong_task`` if ``model`` is known to do another task than ``route`` needs (unknown: let it try).

    The workers announce each model's task in READY (PROTOCOL.md 3.4, 5.2), which the gateway reads from the
    brokers' STATS (gateway/catalog.py); the message names the routes that do answer the model (:func:`task_routes`).
    """
    if task is None or task in needed:
        return
    wanted = " or ".join(sorted(needed))
    hint = f"; point {setting} at a {wanted} model" if setting else ""
    raise ApiError("wrong_task", f"{route} needs a {wanted} model, but {model!r} is a {task} model, answered by "
                                 f"{task_routes(task)}{hint}")


@functools.cache
def _claimed() -> dict[str, tuple[Dialect, Claim]]:
    """Each claimed path, with its claim and the dialect claiming it."""
    return {claim.path: (dialect, claim) for dialect in declared() for claim in dialect.claims}


def all_routes() -> list[web.RouteDef]:
    """Every dialect's routes, in order; a claimed route answers the claim's media types with the claim's handler."""
    claims = {(claim.method, claim.path): claim for _, claim in _claimed().values()}
    routes = []
    for route in (route for dialect in declared() for route in dialect.routes):
        claim = claims.pop((route.method, route.path), None) if isinstance(route, web.RouteDef) else None
        routes.append(route if claim is None else
                      web.route(route.method, route.path, by_media_type(claim, route.handler), **route.kwargs))
    if claims:
        raise ValueError(f"claims on routes no dialect declares: {sorted(claims)}")
    return routes


def by_media_type(claim: Claim, handler: Handler) -> Handler:
    """One handler for a shared route: the claim's for its media types, ``handler`` for the rest."""
    async def answer(request: web.Request) -> web.StreamResponse:
        if request.content_type in claim.media_types:
            return await claim.handler(request)
        return await handler(request)

    return answer
