"""The gateway's own endpoints: plain-text ``POST /``, liveness, readiness, the models and the brokers' statistics.

Each reads its request (gateway/parsing.py), asks the broker, and answers
JSON.  Failures are raised, never answered here: the error middleware
(gateway/errors.py) turns each into its status and the gateway's own
``{"error": {"code", "message"}}`` body, which is also the shape of every
path no other dialect claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.catalog import default_model, fleet_stats, followed_config, models_of, readiness
from gateway.config import GatewayConfig
from gateway.dialects import Dialect, routes_by_dialect
from gateway.errors import ApiError
from gateway.inference import call_of, run, with_tokens
from gateway.openapi_parts import BROKER_QUERY_ERRORS, answer, get, inference
from gateway.parsing import TEXT_TYPES, check_inputs, decode_text, read_body
from gateway.responses import json_response, jsonable

READY_PROBE_TIMEOUT_MS = 1000


async def post_text(request: web.Request) -> web.Response:
    """The raw body is one text for the default model: ``curl -d "hello world" host:8000/``.  JSON is TEI's root,
    which the TEI dialect claims (gateway/dialects/tei.py)."""
    text = decode_text(await read_body(request, TEXT_TYPES, optional=True), request.charset)
    config = request.app[CONFIG]
    check_inputs(config, 1, [text])  # the caller's mistake first, then which model the gateway follows
    result = await run(call_of(request), await default_model(request, config.named_default_model), [text], {})
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


async def get_models(request: web.Request) -> web.Response:
    """Every model the brokers know: its task, the routes of each dialect that answer it, its figures and
    workers (merged over the brokers)."""
    return web.json_response(models_listing(await fleet_stats(request), request.app[CONFIG]))


def models_listing(stats: Mapping[str, Any], config: GatewayConfig) -> dict[str, Any]:
    """``GET /models``: every model the broker knows, its task, the routes of each dialect that answer it
    (as each dialect declares; TEI's only where ``config`` puts it), its figures and the workers serving it."""
    workers = stats.get("workers", [])
    config = followed_config(config, models_of(stats))
    listing = []
    for name, figures in sorted(stats.get("models", {}).items()):
        task = (figures.get("info") or {}).get("task")
        listing.append({
            "name": name,
            "task": task,
            "dialects": routes_by_dialect(task, name, config),
            "workers": [jsonable(w) for w in workers if name in w.get("models", ())],
            "stats": jsonable(figures),
        })
    return {"models": listing}


async def get_stats(request: web.Request) -> web.Response:
    """The brokers' statistics: merged at the top level, each broker's as it sent them under ``brokers``."""
    return web.json_response(jsonable(await fleet_stats(request)))


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    """``POST /`` answers the default model, whatever its task."""
    return ["POST /"] if config is not None and model == config.named_default_model else []


ANY_OUTPUT = {"description": "The model's output for one input: for the embeddings task an array of floats"}
SCHEMAS: dict[str, Any] = {
    "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    "Stats": {
        "type": "object", "description": "The broker's STATS payload (zbatch/protocol/PROTOCOL.md, section 3.6)",
        "properties": {"uptime_s": {"type": "number"}, "draining": {"type": "boolean"},
                       "models": {"type": "object", "additionalProperties": {"type": "object"}},
                       "workers": {"type": "array", "items": {"type": "object"}}},
    },
    "Models": {
        "type": "object", "required": ["models"],
        "properties": {"models": {"type": "array", "items": {
            "type": "object", "required": ["name", "task", "dialects", "workers", "stats"],
            "properties": {"name": {"type": "string"},
                           "task": {"type": "string", "nullable": True},
                           "dialects": {"type": "object", "description": "The routes that answer the model, "
                                                                         "by dialect",
                                        "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                           "workers": {"type": "array", "items": {"type": "object"}},
                           "stats": {"type": "object"}}}}},
    },
}
PATHS: dict[str, Any] = {
    "/": inference("Run the default model on the raw body (curl -d); JSON is TEI's root, as TEI's router mounts "
                   "it: the TEI route of the default model's task answers it (/embed, /embed_sparse, /rerank or "
                   "/predict), in TEI's shapes, errors and statuses",
                   {"text/plain": {"schema": {"type": "string", "minLength": 1}, "example": "hello world"},
                    "application/json": {"schema": {"oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in
                                                              ("EmbedRequest", "RerankRequest", "PredictRequest")]},
                                         "example": {"inputs": "hello world"}}},
                   answer("The default model's output", ANY_OUTPUT, tokens=True)),
    "/healthz": get("Liveness: the gateway process answers", answer("Up", {"$ref": "#/components/schemas/Status"})),
    "/readyz": get("Readiness: a broker answers, is not draining and has a worker for every required model "
                   "(with several brokers, the body's brokers map says which are ready and why not)",
                   answer("Ready", {"$ref": "#/components/schemas/Status"}), *BROKER_QUERY_ERRORS, "no_worker"),
    "/models": get("Models the brokers know, their figures and workers",
                   answer("Models", {"$ref": "#/components/schemas/Models"}), *BROKER_QUERY_ERRORS),
    "/v1/stats": get("The brokers' statistics, merged; each broker's own under brokers",
                     answer("Statistics", {"$ref": "#/components/schemas/Stats"}), *BROKER_QUERY_ERRORS),
}

DIALECT = Dialect(
    name="zbatch", title="the gateway",
    routes=(web.post("/", post_text), web.get("/healthz", get_health), web.get("/readyz", get_ready),
            web.get("/models", get_models), web.get("/v1/stats", get_stats)),
    error_paths=frozenset({"/v1/stats"}),  # the gateway's own endpoint under OpenAI's /v1
    openapi_paths=PATHS, openapi_schemas=SCHEMAS, answers=answers, order=0,
)
