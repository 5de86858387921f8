"""The gateway application: its middlewares, its routes, and the broker client it lives with.

Every endpoint but ``/metrics`` and ``/openapi.json`` belongs to a dialect
(gateway/dialects/: the gateway's own, Hugging Face, OpenAI, TEI, KServe v2),
which declares its routes and its error shape; the error vocabulary is
gateway/errors.py.  This module only puts them together: it mounts what the
dialects declare.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.appkeys import CLIENT, CONFIG, IN_FLIGHT
from gateway.catalog import CATALOG, Catalog
from gateway.config import GatewayConfig
from gateway.connections import track_requests
from gateway.dialects import all_routes, error_shape_of
from gateway.errors import json_errors
from gateway.guard import ApiKeys, InFlight, limit_in_flight, read_api_keys, require_api_key
from gateway.metrics import METRICS, GatewayMetrics, get_metrics, measure
from gateway.openapi import DOCUMENT
from gateway.tracing import request_ids
from zbatch.client import AsyncClient
from zbatch.runtime.curve import client_keys

__all__ = ["CLIENT", "CONFIG", "ROUTES", "create_app"]

async def get_openapi(request: web.Request) -> web.Response:
    """The OpenAPI document of these endpoints."""
    return web.json_response(DOCUMENT)


ROUTES = [*all_routes(), web.get("/metrics", get_metrics), web.get("/openapi.json", get_openapi)]


def create_app(config: GatewayConfig, client: AsyncClient | None = None) -> web.Application:
    """The gateway; without ``client`` it opens one to ``config.frontend`` for its lifetime."""
    # Outermost first: the connection learns its request's headers are in; the request id is on every
    # answer, and the metrics see the final status; the guards (API key, body, requests in flight) run
    # before any handler.
    in_flight = InFlight(config.max_connections)
    app = web.Application(
        middlewares=[track_requests, request_ids, measure, json_errors(error_shape_of), *guards(config, in_flight)],
        client_max_size=config.max_body_bytes,
    )
    app[CONFIG] = config
    app[IN_FLIGHT] = in_flight
    app[METRICS] = GatewayMetrics({name for name in (config.named_default_model, *config.required_models) if name})
    app[CATALOG] = catalog = Catalog()
    app.on_cleanup.append(lambda _: catalog.close())
    if client is None:
        app.cleanup_ctx.append(_client_context)
    else:
        app[CLIENT] = client
    app.add_routes(ROUTES)
    return app


def guards(config: GatewayConfig, in_flight: InFlight) -> list[Middleware]:
    """The key check (when keys are configured), then the body and the in-flight limit."""
    middlewares = [limit_in_flight(in_flight, config.max_body_bytes, config.body_timeout_ms / 1000)]
    if config.api_keys_file:
        middlewares.insert(0, require_api_key(ApiKeys(read_api_keys(config.api_keys_file)), config.protect_metrics))
    return middlewares


def broker_client(config: GatewayConfig) -> AsyncClient:
    """The gateway's client of its brokers, as its settings say."""
    curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
    return AsyncClient(config.frontend, timeout_ms=config.timeout_ms, curve=curve, heartbeat_ms=config.heartbeat_ms,
                       heartbeat_liveness=config.heartbeat_liveness, restart_wait_ms=config.broker_restart_wait_ms)


async def _client_context(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    async with broker_client(config) as client:
        app[CLIENT] = client
        await client.connect()
        yield
