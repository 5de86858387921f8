"""The gateway's own endpoints: each reads its request (gateway/parsing.py), asks the broker, and answers JSON.

The other dialects' endpoints, ``POST /models/{model}`` included, are in gateway/dialects/.

Failures are raised, never answered here: the error middleware
(gateway/errors.py) turns each into its status and ``{"error": {...}}`` body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.catalog import fleet_stats
from gateway.errors import ApiError
from gateway.inference import run, with_tokens
from gateway.openapi import DOCUMENT
from gateway.parsing import TEXT_TYPES, decode_text, read_body
from gateway.responses import json_response, jsonable, models_listing

READY_PROBE_TIMEOUT_MS = 1000


async def post_text(request: web.Request) -> web.Response:
    """The raw body is one text for the default model: ``curl -d "hello world" host:8000/``."""
    text = decode_text(await read_body(request, TEXT_TYPES, optional=True), request.charset)
    result = await run(request, request.app[CONFIG].default_model, [text], {})
    return with_tokens(json_response(result.outputs[0]), result)


async def get_health(request: web.Request) -> web.Response:
    """Liveness: the process answers; it says nothing about the broker."""
    return web.json_response({"status": "ok"})


async def get_ready(request: web.Request) -> web.Response:
    """Readiness: at least one broker answers, is not draining, and has a worker for every required model.

    With several brokers, the body also says which brokers are ready and why the others are not.
    """
    by_broker = await request.app[CLIENT].stats_by_broker(timeout_ms=READY_PROBE_TIMEOUT_MS)
    required = request.app[CONFIG].required_models
    verdicts = {endpoint: readiness(stats, required) for endpoint, stats in by_broker.items()}
    if not any(verdict == "ready" for verdict in verdicts.values()):
        answered = [stats for stats in by_broker.values() if not isinstance(stats, Exception)]
        if not answered:
            raise next(error for error in by_broker.values() if isinstance(error, Exception))
        if len(verdicts) > 1:
            raise ApiError("no_worker", "no broker is ready: " + "; ".join(f"{e}: {v}" for e, v in verdicts.items()))
        if answered[0].get("draining"):
            raise ApiError("broker_unavailable", "the broker is draining and takes no new work")
        raise ApiError("no_worker", next(iter(verdicts.values())))
    if len(verdicts) == 1:
        return web.json_response({"status": "ready"})
    return web.json_response({"status": "ready", "brokers": verdicts})


def readiness(stats: Mapping[str, Any] | Exception, required: tuple[str, ...]) -> str:
    """``ready``, or why one broker is not: it does not answer, it drains, or a required model has no worker."""
    if isinstance(stats, Exception):
        return f"not answering ({stats})"
    if stats.get("draining"):
        return "draining"
    missing = [m for m in required if worker_count(stats, m) < 1]
    return f"no worker serves {', '.join(missing)}" if missing else "ready"


def worker_count(stats: Mapping[str, Any], model: str) -> int:
    """How many workers the broker has for ``model`` (0 for a model it does not know)."""
    return int(stats.get("models", {}).get(model, {}).get("workers", 0))


async def get_models(request: web.Request) -> web.Response:
    """Every model the brokers know: its task, the routes of each dialect that answer it, its figures and
    workers (merged over the brokers)."""
    return web.json_response(models_listing(await fleet_stats(request), request.app[CONFIG].tei_models))


async def get_stats(request: web.Request) -> web.Response:
    """The brokers' statistics: merged at the top level, each broker's as it sent them under ``brokers``."""
    return web.json_response(jsonable(await fleet_stats(request)))


async def get_openapi(request: web.Request) -> web.Response:
    """The OpenAPI document of these endpoints."""
    return web.json_response(DOCUMENT)
