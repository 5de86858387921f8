"""The HTTP API: validate a request, forward it through :class:`AsyncClient`, answer JSON.

Failures are raised; the middleware of gateway/errors.py answers them.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import hdrs, web

from gateway.config import GatewayConfig
from gateway.errors import ApiError, bad_request, json_errors
from gateway.guard import guards
from gateway.metrics import METRICS, MODEL, GatewayMetrics, get_metrics, measure
from gateway.openapi import DOCUMENT
from gateway.tracing import REQUEST_ID, request_ids
from gateway.views import json_response, jsonable, models_listing, worker_count
from zbatch.client import AsyncClient, WorkerError
from zbatch.protocol.wire import MAX_NAME_CHARS
from zbatch.runtime.curve import client_keys

CONFIG = web.AppKey("config", GatewayConfig)
CLIENT = web.AppKey("client", AsyncClient)

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
PRIORITY_HEADER = "X-Priority"
PRIORITIES = {"high": 0, "normal": 1, "low": 2, "0": 0, "1": 1, "2": 2}
READY_PROBE_TIMEOUT_MS = 1000
JSON_TYPES = frozenset({"application/json"})
# curl -d sends form-urlencoded; POST / takes the raw body as the text either way.
TEXT_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded"})

# --------------------------------------------------------------------------
# Request parsing
# --------------------------------------------------------------------------


async def read_body(
    request: web.Request, content_types: Collection[str], *, optional: bool = False
) -> bytes:
    """The body, after refusing an oversize declared length or a content type we cannot read.

    ``optional`` accepts a request without a Content-Type header.  Chunked bodies
    have no length up front; the application's ``client_max_size`` stops those.
    """
    limit = request.app[CONFIG].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
            "payload_too_large",
            f"the body has {request.content_length} bytes; the limit is {limit}",
        )
    if (
        not (optional and hdrs.CONTENT_TYPE not in request.headers)
        and request.content_type not in content_types
    ):
        expected = " or ".join(sorted(content_types))
        raise ApiError("unsupported_media_type", f"Content-Type must be {expected}")
    return await request.read()


async def read_json(request: web.Request) -> dict[str, Any]:
    body = await read_body(request, JSON_TYPES)
    if not body:
        raise bad_request("the body is empty; send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise bad_request("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


def parse_inputs(body: Mapping[str, Any], field: str) -> tuple[list[str], bool]:
    """The texts to run, and whether a single string came in (so a single output goes out)."""
    if field not in body:
        raise bad_request(f'missing "{field}"')
    value = body[field]
    if isinstance(value, str):
        texts, single = [value], True
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        texts, single = value, False
    else:
        raise bad_request(f'"{field}" must be a string or a non-empty list of strings')
    if not all(texts):
        raise bad_request(f'"{field}" must not contain empty strings')
    return texts, single


def check_input_limits(config: GatewayConfig, texts: list[str]) -> None:
    """Refuse more inputs, or longer ones, than this gateway takes, before the broker sees them."""
    if len(texts) > config.max_inputs:
        raise ApiError("too_many_inputs",
                       f"{len(texts)} inputs; the limit is {config.max_inputs} per request: split it")
    longest = max(map(len, texts))
    if longest > config.max_input_chars:
        raise ApiError("input_too_long",
                       f"an input has {longest} characters; the limit is {config.max_input_chars}")


def parse_parameters(body: Mapping[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise bad_request('"parameters" must be a JSON object')
    return parameters


def request_timeout_ms(request: web.Request) -> int | None:
    """The caller's timeout, which may shorten but never extend the configured one."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    # Ten digits is over 100 days, and keeps int() away from absurdly long strings.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and int(raw) > 0):
        raise bad_request(f"{TIMEOUT_HEADER} must be a positive whole number of milliseconds")
    return min(int(raw), request.app[CONFIG].timeout_ms)


def request_priority(request: web.Request) -> int:
    """``X-Priority``: high, normal (the default) or low, or the protocol's 0, 1, 2."""
    raw = request.headers.get(PRIORITY_HEADER, "normal").strip().lower()
    if raw not in PRIORITIES:
        raise bad_request(f"{PRIORITY_HEADER} must be high, normal or low")
    return PRIORITIES[raw]


async def run(
    request: web.Request, model: str, texts: list[str], parameters: dict[str, Any]
) -> list[Any]:
    """One output per text, in order, from the broker."""
    check_input_limits(request.app[CONFIG], texts)
    if not 1 <= len(model) <= MAX_NAME_CHARS:
        raise bad_request(f"the model name must have 1 to {MAX_NAME_CHARS} characters")
    request[MODEL] = model
    client = request.app[CLIENT]
    outputs = await client.infer(
        model, texts, parameters, timeout_ms=request_timeout_ms(request),
        priority=request_priority(request), trace=request[REQUEST_ID],
    )
    if len(outputs) != len(texts):
        raise WorkerError(f"the worker returned {len(outputs)} outputs for {len(texts)} inputs")
    return outputs


# --------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------


async def post_model(request: web.Request) -> web.Response:
    """Hugging Face Inference API shape: ``{"inputs": str | [str], "parameters": {...}}``."""
    body = await read_json(request)
    texts, single = parse_inputs(body, "inputs")
    outputs = await run(request, request.match_info["model"], texts, parse_parameters(body))
    return json_response(outputs[0] if single else outputs)


async def post_text(request: web.Request) -> web.Response:
    """The raw body is one text for the default model: ``curl -d "hello world" host:8000/``."""
    body = await read_body(request, TEXT_TYPES, optional=True)
    try:
        text = body.decode(request.charset or "utf-8")
    except (UnicodeDecodeError, LookupError):
        raise bad_request("the body is not text in its declared charset (default utf-8)") from None
    if not text:
        raise bad_request("the body is empty; send the text to process")
    outputs = await run(request, request.app[CONFIG].default_model, [text], {})
    return json_response(outputs[0])


async def post_embeddings(request: web.Request) -> web.Response:
    """OpenAI ``/v1/embeddings``; ``usage`` is always zero, since the gateway counts no tokens.

    ``encoding_format`` may be "float" (the default) or "base64" (little-endian
    float32, as OpenAI sends it), which the official SDK asks for by default.
    """
    body = await read_json(request)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request('"model" must be a non-empty string')
    texts, _ = parse_inputs(body, "input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise bad_request('"encoding_format" must be "float" or "base64"')
    outputs = await run(request, model, texts, {})
    data = [
        {"object": "embedding", "index": index, "embedding": encode_embedding(output, encoding)}
        for index, output in enumerate(outputs)
    ]
    usage = {"prompt_tokens": 0, "total_tokens": 0}
    return json_response({"object": "list", "data": data, "model": model, "usage": usage})


def encode_embedding(output: Any, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.asarray(output, dtype="<f4").tobytes()).decode("ascii")
    return output  # json_response writes numpy arrays itself


async def get_health(request: web.Request) -> web.Response:
    """Liveness: the process answers; it says nothing about the broker."""
    return web.json_response({"status": "ok"})


async def get_ready(request: web.Request) -> web.Response:
    """Readiness: the broker answers, is not draining, and every required model has a worker."""
    stats = await request.app[CLIENT].stats(timeout_ms=READY_PROBE_TIMEOUT_MS)
    if stats.get("draining"):
        raise ApiError("broker_unavailable", "the broker is draining and takes no new work")
    missing = [m for m in request.app[CONFIG].required_models if worker_count(stats, m) < 1]
    if missing:
        raise ApiError("no_worker", f"no worker serves {', '.join(missing)}")
    return web.json_response({"status": "ready"})


async def get_models(request: web.Request) -> web.Response:
    return web.json_response(models_listing(await request.app[CLIENT].stats()))


async def get_stats(request: web.Request) -> web.Response:
    return web.json_response(jsonable(await request.app[CLIENT].stats()))


async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(DOCUMENT)


# --------------------------------------------------------------------------
# Application
# --------------------------------------------------------------------------


def create_app(config: GatewayConfig, client: AsyncClient | None = None) -> web.Application:
    """The gateway; without ``client`` it opens one to ``config.frontend`` for its lifetime."""
    # Outermost first: the request id is on every answer, and the metrics see the final status;
    # the guards (API key, requests in flight) run before any handler reads a body.
    app = web.Application(
        middlewares=[request_ids, measure, json_errors, *guards(config)], client_max_size=config.max_body_bytes
    )
    app[CONFIG] = config
    app[METRICS] = GatewayMetrics({config.default_model, *config.required_models})
    if client is None:
        app.cleanup_ctx.append(_client_context)
    else:
        app[CLIENT] = client
    app.add_routes(
        [
            web.post("/", post_text),
            web.post("/models/{model:.+}", post_model),
            web.post("/v1/embeddings", post_embeddings),
            web.get("/healthz", get_health),
            web.get("/readyz", get_ready),
            web.get("/models", get_models),
            web.get("/v1/stats", get_stats),
            web.get("/metrics", get_metrics),
            web.get("/openapi.json", get_openapi),
        ]
    )
    return app


async def _client_context(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
    async with AsyncClient(config.frontend, timeout_ms=config.timeout_ms, curve=curve) as client:
        app[CLIENT] = client
        yield
