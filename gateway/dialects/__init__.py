"""The HTTP dialects the gateway speaks, one module each, and what each one declares.

Every module of this package is a dialect and defines ``DIALECT``, a
:class:`Dialect`: its routes, the paths whose errors take its
:class:`~gateway.errors.ErrorShape`, its part of the OpenAPI document, and
which of its routes answer a model of a task (for ``GET /models`` and the
``wrong_task`` messages).  The application mounts what :func:`declared`
finds, the error middleware asks :func:`error_shape_of`, and the document
(gateway/openapi.py) gathers the parts, so a new dialect is one new module
and its tests.  A dialect imports the gateway's shared modules, never
another dialect (tests/test_layout.py).

* :mod:`~gateway.dialects.zbatch`: the gateway's own, ``POST /``, health, readiness, models, statistics.
* :mod:`~gateway.dialects.huggingface`: the Hugging Face Inference API shapes of ``POST /models/{model}``.
* :mod:`~gateway.dialects.openai`: OpenAI's ``/v1/models`` and ``/v1/embeddings``.
* :mod:`~gateway.dialects.tei`: Hugging Face Text Embeddings Inference.
* :mod:`~gateway.dialects.kserve`: the Open Inference Protocol (KServe v2, Triton) over HTTP under ``/v2``.

The KServe v2 gRPC service (gateway/grpc/) is a protocol of its own port,
not a set of HTTP routes; it shares the KServe tensors of each task with the
HTTP dialect through gateway/signatures.py.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.errors import ZBATCH_ERRORS, ErrorShape

if TYPE_CHECKING:
    from gateway.config import GatewayConfig

# (task or None for unknown, the model or None for any, the gateway's settings or None for any) -> routes
RoutesFor = Callable[["str | None", "str | None", "GatewayConfig | None"], list[str]]


def no_routes(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    return []


@dataclass(frozen=True)
class Dialect:
    """What one dialect module declares.

    ``name``: its key in ``GET /models``' ``dialects``; ``title``: how messages name it.
    ``routes``: its aiohttp routes, in the order they must be tried.
    ``error_paths`` and ``error_prefixes``: the paths whose errors, a 404 or 405 included,
    are answered in ``errors``; an exact path wins over a prefix, a longer prefix over a shorter.
    ``openapi_paths`` and ``openapi_schemas``: its part of ``/openapi.json``.
    ``answers``: its routes that answer a model of a task (:data:`RoutesFor`).
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


def error_shape_of(path: str) -> ErrorShape:
    """The error shape a path answers in: its dialect's (see :class:`Dialect`), else the gateway's own."""
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


def all_routes() -> list[web.RouteDef]:
    return [route for dialect in declared() for route in dialect.routes]
