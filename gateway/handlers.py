"""The endpoints: each reads its request (gateway/parsing.py), asks the broker, and answers JSON.

Failures are raised, never answered here: the error middleware
(gateway/errors.py) turns each into its status and ``{"error": {...}}`` body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.errors import ApiError
from gateway.metrics import MODEL
from gateway.openapi import DOCUMENT
from gateway.parsing import (
    TEXT_TYPES,
    check_limits,
    decode_text,
    parse_embeddings,
    parse_inputs,
    parse_parameters,
    read_body,
    read_json,
    request_priority,
    request_timeout_ms,
)
from gateway.responses import encode_embedding, json_response, jsonable, models_listing
from gateway.tracing import REQUEST_ID
from zbatch.client import WorkerError
from zbatch.client.stats import merge_stats

READY_PROBE_TIMEOUT_MS = 1000


async def run(
    request: web.Request, model: str, texts: list[str], parameters: dict[str, Any]
) -> list[Any]:
    """One output per text, in order, from the broker."""
    check_limits(request.app[CONFIG], model, texts)
    request[MODEL] = model
    client = request.app[CLIENT]
    outputs = await client.infer(
        model, texts, parameters, timeout_ms=request_timeout_ms(request),
        priority=request_priority(request), trace=request[REQUEST_ID],
    )
    if len(outputs) != len(texts):
        raise WorkerError(f"the worker returned {len(outputs)} outputs for {len(texts)} inputs")
    return outputs


async def post_model(request: web.Request) -> web.Response:
    """Hugging Face Inference API shape: ``{"inputs": str | [str], "parameters": {...}}``."""
    body = await read_json(request)
    texts, single = parse_inputs(body, "inputs")
    outputs = await run(request, request.match_info["model"], texts, parse_parameters(body))
    return json_response(outputs[0] if single else outputs)


async def post_text(request: web.Request) -> web.Response:
    """The raw body is one text for the default model: ``curl -d "hello world" host:8000/``."""
    text = decode_text(await read_body(request, TEXT_TYPES, optional=True), request.charset)
    outputs = await run(request, request.app[CONFIG].default_model, [text], {})
    return json_response(outputs[0])


async def post_embeddings(request: web.Request) -> web.Response:
    """OpenAI ``/v1/embeddings``; ``usage`` is always zero, since the gateway counts no tokens.

    ``encoding_format`` may be "float" (the default) or "base64" (little-endian
    float32, as OpenAI sends it), which the official SDK asks for by default.
    """
    model, texts, encoding = parse_embeddings(await read_json(request))
    outputs = await run(request, model, texts, {})
    data = [
        {"object": "embedding", "index": index, "embedding": encode_embedding(output, encoding)}
        for index, output in enumerate(outputs)
    ]
    usage = {"prompt_tokens": 0, "total_tokens": 0}
    return json_response({"object": "list", "data": data, "model": model, "usage": usage})


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
    """Every model the brokers know, with its figures and workers (merged over the brokers)."""
    return web.json_response(models_listing(await fleet_stats(request)))


async def get_stats(request: web.Request) -> web.Response:
    """The brokers' statistics: merged at the top level, each broker's as it sent them under ``brokers``."""
    return web.json_response(jsonable(await fleet_stats(request)))


async def fleet_stats(request: web.Request) -> dict[str, Any]:
    """Every broker's statistics in one view (zbatch/client/stats.py); the error if none answers."""
    return merge_stats(await request.app[CLIENT].stats_by_broker())


async def get_openapi(request: web.Request) -> web.Response:
    """The OpenAPI document of these endpoints."""
    return web.json_response(DOCUMENT)
