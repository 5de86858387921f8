"""The gateway application: its middlewares, its routes, and the broker client it lives with.

The gateway's own endpoints are in gateway/handlers.py, the other dialects'
in gateway/dialects/ (Hugging Face, OpenAI, TEI, KServe v2), the error
vocabulary in gateway/errors.py; this module only puts them together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway import handlers
from gateway.appkeys import CATALOG, CLIENT, CONFIG
from gateway.catalog import Catalog
from gateway.config import GatewayConfig
from gateway.connections import track_requests
from gateway.dialects import huggingface, kserve, openai, tei
from gateway.errors import json_errors
from gateway.guard import guards
from gateway.metrics import METRICS, GatewayMetrics, get_metrics, measure
from gateway.tracing import request_ids
from zbatch.client import AsyncClient
from zbatch.runtime.curve import client_keys

__all__ = ["CLIENT", "CONFIG", "ROUTES", "create_app"]

ROUTES = [
    web.post("/", handlers.post_text),
    web.post("/models/{model:.+}", huggingface.post_model),
    web.post("/v1/embeddings", openai.post_embeddings),
    web.get("/v1/models", openai.get_models),
    web.get("/v1/models/{model:.+}", openai.get_model),
    web.post("/embed", tei.embed),
    web.post("/rerank", tei.rerank),
    web.post("/predict", tei.predict),
    web.post("/similarity", tei.post_similarity),
    web.post("/tokenize", tei.tokenize),
    web.get("/info", tei.info),
    web.get("/health", tei.health),
    web.get("/v2", kserve.get_server),
    web.get("/v2/health/live", kserve.get_live),
    web.get("/v2/health/ready", kserve.get_ready),
    # The model name may hold slashes (org/name): the longer paths are tried first.
    web.post("/v2/models/{model:.+}/infer", kserve.post_infer),
    web.get("/v2/models/{model:.+}/ready", kserve.get_model_ready),
    web.get("/v2/models/{model:.+}", kserve.get_model),
    web.get("/healthz", handlers.get_health),
    web.get("/readyz", handlers.get_ready),
    web.get("/models", handlers.get_models),
    web.get("/v1/stats", handlers.get_stats),
    web.get("/metrics", get_metrics),
    web.get("/openapi.json", handlers.get_openapi),
]


def create_app(config: GatewayConfig, client: AsyncClient | None = None) -> web.Application:
    """The gateway; without ``client`` it opens one to ``config.frontend`` for its lifetime."""
    # Outermost first: the connection learns its request's headers are in; the request id is on every
    # answer, and the metrics see the final status; the guards (API key, body, requests in flight) run
    # before any handler.
    app = web.Application(
        middlewares=[track_requests, request_ids, measure, json_errors, *guards(config)],
        client_max_size=config.max_body_bytes,
    )
    app[CONFIG] = config
    app[METRICS] = GatewayMetrics({config.default_model, *config.required_models})
    app[CATALOG] = catalog = Catalog()
    app.on_cleanup.append(lambda _: catalog.close())
    if client is None:
        app.cleanup_ctx.append(_client_context)
    else:
        app[CLIENT] = client
    app.add_routes(ROUTES)
    return app


async def _client_context(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
    async with AsyncClient(config.frontend, timeout_ms=config.timeout_ms, curve=curve,
                           heartbeat_ms=config.heartbeat_ms, heartbeat_liveness=config.heartbeat_liveness) as client:
        app[CLIENT] = client
        yield
