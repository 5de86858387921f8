"""Hugging Face Text Embeddings Inference (TEI): its routes, request and response shapes, statuses and headers.

A TEI server serves one model; the gateway puts one model behind each TEI
route, from its settings (:func:`route_models`): ``ZBATCH_TEI_MODEL``
(default: the default model) answers ``/embed``, ``/embed_all``,
``/similarity``, ``/tokenize``, ``/decode``, ``/info`` and ``/health``;
``ZBATCH_TEI_SPARSE_MODEL`` ``/embed_sparse`` (a ``sparse-embeddings`` model),
``ZBATCH_TEI_RERANK_MODEL`` ``/rerank`` and ``ZBATCH_TEI_PREDICT_MODEL``
``/predict`` (the three default to the TEI model).  A route whose model does
another task answers TEI's 424, naming the routes that answer that task and
the setting to change.

JSON at the gateway's ``POST /`` is TEI's root, as TEI's own router mounts it
(what ``huggingface_hub.InferenceClient(model="http://host:port")`` and TEI's
load tests post): the route of the root model's task answers it, ``/embed``,
``/embed_sparse``, ``/rerank`` or ``/predict``; the root model is the default
model, which plain text at ``POST /`` runs too (gateway/dialects/zbatch.py).

As TEI: ``prompt_name`` picks a prompt of the model's
``config_sentence_transformers.json`` (the worker's ``--default-prompt-name``
applies when none is named); a batch of more than ``max_client_batch_size``
(the gateway's ``max_inputs``) is a 422 saying ``batch size N > maximum
allowed batch size M``; answers carry ``x-compute-tokens`` and
``x-compute-characters`` (and the gateway's ``X-Tokens``); errors are
``{"error": str, "error_type": str}`` with TEI's statuses (:data:`STATUSES`).
Differences from TEI: token ids as inputs are refused, an empty batch is a
422 (TEI: 400 ``Empty``), and ``/tokenize`` offsets count code points
(PROTOCOL.md 5.3).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.catalog import CATALOG, ModelInfo, default_model, fleet_stats
from gateway.config import GatewayConfig
from gateway.dialects import Claim, Dialect, require_task, task_routes
from gateway.errors import ERRORS as CODES
from gateway.errors import ApiError, ErrorCode, ErrorShape, bad_request
from gateway.inference import Call, Result, call_of, run, token_headers
from gateway.openapi_parts import (
    BROKER_QUERY_ERRORS,
    FLAG,
    NUMBERS,
    PROMPT_NAME,
    TEXT,
    TEXTS,
    TOKEN_ID_LISTS,
    TRUNCATION,
    answer,
    errors_for,
    get,
    inference,
    json_body,
    object_schema,
    ref,
)
from gateway.parsing import JSON_TYPES, model_options, optional_flag, read_json, token_ids
from gateway.responses import VERSION, json_response
from gateway.similarity import similarity, similarity_inputs
from zbatch.protocol import vocabulary as v

TRUNCATION_OPTIONS = (v.TRUNCATE, v.TRUNCATION_DIRECTION)
SETTINGS = {"/rerank": "ZBATCH_TEI_RERANK_MODEL", "/predict": "ZBATCH_TEI_PREDICT_MODEL",
            "/embed_sparse": "ZBATCH_TEI_SPARSE_MODEL", "/": "ZBATCH_DEFAULT_MODEL"}
MAIN_SETTING = "ZBATCH_TEI_MODEL"
# TEI's status and error_type of the gateway's codes, where they differ from "the same status, Validation
# below 500 and Backend from 500" (TEI's own: 413, 422 validation; 424 backend; 429 overloaded; 503 unhealthy).
STATUSES: dict[str, tuple[int, str]] = {
    "bad_request": (422, "Validation"), "input_too_long": (422, "Validation"), "too_many_inputs": (422, "Validation"),
    "wrong_task": (424, "Backend"), "worker_error": (424, "Backend"), "worker_lost": (424, "Backend"),
    "upstream_error": (424, "Backend"), "overloaded": (429, "Overloaded"), "unknown_model": (503, "Unhealthy"),
    "no_worker": (503, "Unhealthy"), "broker_unavailable": (503, "Unhealthy"),
}
ERROR_TYPES = ("Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty")


def is_text_task(task: str | None) -> bool:
    """Whether the model takes text (and so has a tokenizer); an unknown task is taken to."""
    return task not in v.IMAGE_TASKS


def tei_status(error: ErrorCode) -> tuple[int, str]:
    return STATUSES.get(error.code) or (error.status, "Backend" if error.status >= 500 else "Validation")


def error_answer(error: ApiError) -> tuple[int, Any]:
    """TEI's shape; an error whose status was overridden (an aiohttp refusal) keeps it."""
    status, kind = (tei_status(CODES[error.code]) if error.status == CODES[error.code].status
                    else (error.status, "Backend" if error.status >= 500 else "Validation"))
    return status, {"error": error.message, "error_type": kind}


ERRORS = ErrorShape("TEIError", object_schema(["error", "error_type"], {
    "error": {"type": "string"}, "error_type": {"type": "string", "enum": list(ERROR_TYPES)}}),
    error_answer, lambda error: tei_status(error)[0])


def route_models(config: GatewayConfig) -> dict[str, str]:
    """The model behind each TEI route, by path, as ``config`` names it (TEI serves one model per server; the
    gateway, one per route); "": the default model, whichever the brokers serve.  TEI's root, JSON at ``POST /``,
    runs the default model, as the root's plain text does."""
    main = config.tei_model or config.named_default_model
    return {"/embed": main, "/embed_all": main, "/similarity": main, "/tokenize": main, "/decode": main,
            "/info": main, "/health": main, "/embed_sparse": config.tei_sparse_model or main,
            "/rerank": config.tei_rerank_model or main, "/predict": config.tei_predict_model or main,
            "/": config.named_default_model}


async def route_model(request: web.Request) -> str:
    """The model behind this TEI route: its setting's, else the one model the brokers serve."""
    return await default_model(request, route_models(request.app[CONFIG])[request.path])


async def checked_model(request: web.Request, call: Call, needed: set[str] | frozenset[str]) -> str:
    """The route's model, after refusing one known to do another task (424, naming the setting)."""
    model = await route_model(request)
    require_task(model, await call.task_of(model), needed, request.path, SETTINGS.get(request.path, MAIN_SETTING))
    return model


def tei_answer(value: Any, result: Result, texts: list[str]) -> web.Response:
    """TEI's answer: the JSON, its token and character counts in TEI's headers, and ``X-Tokens``."""
    response = json_response(value)
    response.headers["x-compute-characters"] = str(sum(map(len, texts)))
    response.headers.update(token_headers(result))
    if result.total_tokens is not None:
        response.headers["x-compute-tokens"] = str(result.total_tokens)
    return response


def batch_size(count: int, config: GatewayConfig) -> None:
    """TEI's ``max_client_batch_size`` check, with its message (the gateway's ``max_inputs``)."""
    if count > config.max_inputs:
        raise ApiError("too_many_inputs", f"batch size {count} > maximum allowed batch size {config.max_inputs}")


def strings(value: Any, field: str, config: GatewayConfig) -> tuple[list[str], bool]:
    """TEI's string-or-list inputs: the texts and whether one string came in; token ids are refused."""
    if isinstance(value, str):
        texts, single = [value], True
    elif isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        texts, single = value, False
    elif isinstance(value, list) and value and isinstance(value[0], list | int):
        raise bad_request(f'"{field}" holds token ids: send the texts themselves')
    else:
        raise bad_request(f'"{field}" must be a string or a non-empty list of strings')
    if not all(texts):
        raise bad_request(f'"{field}" must not contain empty strings')
    batch_size(len(texts), config)
    return texts, single


async def embedded(request: web.Request, options: tuple[str, ...], needed: str, operation: str = v.RUN,
                   normalize_by_default: bool = False) -> tuple[Result, list[str]]:
    """Run an embedding route's ``inputs`` with its ``options`` through the route's model.

    ``normalize_by_default``: TEI's ``/embed`` normalizes unless told ``"normalize": false``, whatever the model's
    modules declare (the workers' default is the model's own), so the route says so when the body does not."""
    body = await read_json(request)
    texts, _ = strings(body.get("inputs"), "inputs", request.app[CONFIG])
    parameters = model_options(body, (*options, *TRUNCATION_OPTIONS, v.PROMPT_NAME))
    if normalize_by_default:
        parameters.setdefault(v.NORMALIZE, True)
    call = call_of(request)
    model = await checked_model(request, call, {needed})
    return await run(call, model, texts, parameters, operation=operation), texts


async def embed(request: web.Request) -> web.Response:
    """``POST /embed``: ``{"inputs", "normalize", "dimensions", "truncate", "truncation_direction", "prompt_name"}``
    -> one vector per input, always a list of vectors."""
    result, texts = await embedded(request, (v.NORMALIZE, v.DIMENSIONS), v.EMBEDDINGS, normalize_by_default=True)
    return tei_answer(result.outputs, result, texts)


async def embed_sparse(request: web.Request) -> web.Response:
    """``POST /embed_sparse``: per input, its vocabulary entries of weight above 0 ``[{"index", "value"}]``."""
    result, texts = await embedded(request, (), v.SPARSE_EMBEDDINGS)
    sparse = [[{"index": int(index), "value": float(value)}
               for index, value in zip(output[v.SPARSE_INDICES].tolist(), output[v.SPARSE_VALUES].tolist(),
                                       strict=True)]
              for output in result.outputs]
    return tei_answer(sparse, result, texts)


async def embed_all(request: web.Request) -> web.Response:
    """``POST /embed_all``: per input, a vector for each of its tokens (no pooling, no normalization)."""
    result, texts = await embedded(request, (), v.EMBEDDINGS, v.EMBED_ALL)
    return tei_answer(result.outputs, result, texts)


async def rerank(request: web.Request) -> web.Response:
    """``POST /rerank``: ``{"query", "texts", "raw_scores", "return_text", "truncate", ...}`` ->
    ``[{"index", "score", "text"?}]``, highest score first."""
    body = await read_json(request)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request('"query" must be a non-empty string')
    texts, _ = strings(body.get("texts"), "texts", request.app[CONFIG])
    return_text = optional_flag(body, "return_text")
    parameters = model_options(body, (v.RAW_SCORES, *TRUNCATION_OPTIONS))
    call = call_of(request)
    model = await checked_model(request, call, {v.RERANK})
    result = await run(call, model, [[query, text] for text in texts], parameters, texts=[query, *texts])
    order = sorted(range(len(texts)), key=lambda index: result.outputs[index], reverse=True)
    ranks = [{"index": index, "score": result.outputs[index]} | ({"text": texts[index]} if return_text else {})
             for index in order]
    return tei_answer(ranks, result, [query] * len(texts) + texts)


def predict_inputs(value: Any) -> tuple[list[str | list[str]], bool]:
    """TEI's predict inputs: a string or a pair (one prediction), or a list of 1- or 2-string lists (a batch)."""
    def sequence(item: Any) -> str | list[str] | None:
        if isinstance(item, str):
            return item or None
        if isinstance(item, list) and len(item) in (1, 2) and all(isinstance(s, str) and s for s in item):
            return item[0] if len(item) == 1 else item
        return None

    if isinstance(value, list) and value and all(isinstance(item, list) for item in value):
        batch = [sequence(item) for item in value]
        if all(item is not None for item in batch):
            return [item for item in batch if item is not None], False
    else:
        one = sequence(value)
        if one is not None:
            return [one], True
    raise bad_request('"inputs" must be a text, a pair of texts [text, text_pair], or a batch of those as '
                      'lists: [["text"], ["text", "text_pair"]]; no text may be empty')


async def predict(request: web.Request) -> web.Response:
    """``POST /predict``: ``{"inputs", "raw_scores", "truncate", ...}`` -> every ``{"label", "score"}``,
    highest first, for one input; a list of those for a batch."""
    body = await read_json(request)
    inputs, single = predict_inputs(body.get("inputs"))
    batch_size(len(inputs), request.app[CONFIG])
    parameters = model_options(body, (v.RAW_SCORES, *TRUNCATION_OPTIONS))
    call = call_of(request)
    model = await checked_model(request, call, v.CLASSIFICATION)
    texts = [text for item in inputs for text in ([item] if isinstance(item, str) else item)]
    result = await run(call, model, list(inputs), parameters, texts=texts)
    return tei_answer(result.outputs[0] if single else result.outputs, result, texts)


async def post_similarity(request: web.Request) -> web.Response:
    """``POST /similarity``: ``{"inputs": {"source_sentence", "sentences"}, "parameters"}`` -> cosine similarities."""
    body = await read_json(request)
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise bad_request('"inputs" must be an object: {"source_sentence": str, "sentences": [str]}')
    source, sentences = similarity_inputs(inputs)
    batch_size(1 + len(sentences), request.app[CONFIG])  # as TEI, which embeds the source with them
    options = body.get("parameters") or {}
    if not isinstance(options, dict):
        raise bad_request('"parameters" must be an object')
    parameters = model_options(options, (*TRUNCATION_OPTIONS, v.PROMPT_NAME))
    call = call_of(request)
    model = await checked_model(request, call, {v.EMBEDDINGS})
    scores, result = await similarity(call, model, source, sentences, parameters, request.path)
    return tei_answer(scores, result, [source, *sentences])


async def text_model(request: web.Request, call: Call) -> str:
    """The route's model, which must take text (it has a tokenizer)."""
    model = await route_model(request)
    if not is_text_task(await call.task_of(model)):
        raise ApiError("wrong_task", f"{request.path} needs a text model, but {model!r} takes images; point "
                                     f"{MAIN_SETTING} at a text model")
    return model


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``{"inputs", "add_special_tokens", "prompt_name"}`` -> per input its tokens
    ``{"id", "text", "special", "start", "stop"}`` (offsets in code points)."""
    body = await read_json(request)
    texts, _ = strings(body.get("inputs"), "inputs", request.app[CONFIG])
    parameters = model_options(body, (v.ADD_SPECIAL_TOKENS, v.PROMPT_NAME))
    call = call_of(request)
    result = await run(call, await text_model(request, call), texts, parameters, operation=v.TOKENIZE)
    return tei_answer(result.outputs, result, texts)


async def decode(request: web.Request) -> web.Response:
    """``POST /decode``: ``{"ids", "skip_special_tokens"}`` -> the text of each list of token ids."""
    body = await read_json(request)
    batch = token_ids(body.get("ids"), "ids")
    batch_size(len(batch), request.app[CONFIG])
    parameters = model_options(body, (v.SKIP_SPECIAL_TOKENS,))
    call = call_of(request)
    result = await run(call, await text_model(request, call), list(batch), parameters, texts=(),
                       operation=v.DECODE)
    return tei_answer(result.outputs, result, result.outputs)


# TEI's root answers as the route of its model's task (TEI's router mounts one of them at POST /).
ROOT_ROUTES = {v.EMBEDDINGS: embed, v.SPARSE_EMBEDDINGS: embed_sparse, v.RERANK: rerank,
               **dict.fromkeys(v.CLASSIFICATION, predict)}


async def root(request: web.Request) -> web.StreamResponse:
    """``POST /`` with JSON: TEI's root, answered by the TEI route of the root model's task; a model whose task
    is not known yet is taken for an embeddings model, as TEI's ``{"inputs"}`` is most often an embed."""
    model = await route_model(request)
    task = await call_of(request).task_of(model)
    handler = ROOT_ROUTES.get(task or v.EMBEDDINGS)
    if handler is None:
        raise ApiError("wrong_task", f"JSON at POST / is TEI's, which answers embeddings, sparse-embeddings, rerank "
                                     f"and text-classification models; {model!r} is a {task} model: send its input "
                                     f"as the body itself (text/plain), or use {task_routes(str(task))}")
    return await handler(request)


def model_type(info: ModelInfo) -> dict[str, Any]:
    """TEI's ``model_type``: embedding (mean pooling, as the workers pool; splade), reranker or classifier."""
    labels = {str(index): label for index, label in enumerate(info.labels or ())}
    by_label = {label: index for index, label in enumerate(info.labels or ())}
    if info.task == v.EMBEDDINGS:
        return {"embedding": {"pooling": "mean"}}
    if info.task == v.SPARSE_EMBEDDINGS:
        return {"embedding": {"pooling": "splade"}}
    if info.task == v.RERANK:
        return {"reranker": {"id2label": labels, "label2id": by_label}}
    if info.task in v.CLASSIFICATION:
        return {"classifier": {"id2label": labels, "label2id": by_label}}
    return {str(info.task): {}}


async def info(request: web.Request) -> web.Response:
    """``GET /info``: TEI's description of the TEI model, with what the workers said of it in READY.

    ``max_batch_requests`` is the model's batch size on its worker, ``max_batch_tokens`` its worker's token
    budget for one pass (``--max-batch-tokens``), else that batch size times its longest input,
    ``tokenization_workers`` the workers serving it.
    """
    model = await route_model(request)
    found = await request.app[CATALOG].lookup(request.app[CLIENT], model)
    if found is None:
        raise ApiError("unknown_model", f"no broker knows {model!r}, the model of TEI's routes "
                                        f"({MAIN_SETTING}); start a worker for it")
    config = request.app[CONFIG]
    batch, longest = found.max_batch_size, found.max_length
    return json_response({
        "model_id": model, "model_sha": None, "model_dtype": found.dtype or "unknown",
        "model_type": model_type(found), "max_concurrent_requests": config.max_connections,
        "max_input_length": longest or 0, "max_batch_tokens": found.max_batch_tokens or (batch or 0) * (longest or 0),
        "max_batch_requests": batch, "max_client_batch_size": config.max_inputs, "auto_truncate": True,
        "tokenization_workers": found.workers, "version": VERSION, "sha": None, "docker_label": None,
        "served_model_name": model,
    })


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 with no body while a worker serves the TEI model, else 503 ``Unhealthy``."""
    model = await route_model(request)
    figures = (await fleet_stats(request)).get("models", {}).get(model)
    if not figures or figures.get("workers", 0) < 1:
        raise ApiError("no_worker", f"no worker serves {model!r}, the model of TEI's routes ({MAIN_SETTING})")
    return web.Response(status=200)


# Which TEI routes answer a model of a task (any text task: /tokenize and /decode); GET /info and /health any.
ROUTE_TASKS: dict[str, Any] = {"/embed": {v.EMBEDDINGS}, "/embed_all": {v.EMBEDDINGS},
                               "/similarity": {v.EMBEDDINGS}, "/embed_sparse": {v.SPARSE_EMBEDDINGS},
                               "/rerank": {v.RERANK}, "/predict": v.CLASSIFICATION, "/tokenize": is_text_task,
                               "/decode": is_text_task, "/info": None, "/health": None, "/": set(ROOT_ROUTES)}


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    """TEI's routes whose model, by the settings, is ``model`` (any model without them) and whose task fits."""
    def fits(needed: Any) -> bool:
        return needed is None or (needed(task) if callable(needed) else task in needed)

    behind = route_models(config) if config is not None else {}
    return [f"{'GET' if needed is None else 'POST'} {path}" for path, needed in ROUTE_TASKS.items()
            if fits(needed) and (model is None or behind.get(path) == model)]


def tei_inference(summary: str, schema: str, ok: dict[str, Any]) -> dict[str, Any]:
    """A TEI inference route: its answer carries TEI's counts too."""
    for name in ("x-compute-tokens", "x-compute-characters"):
        ok["headers"][name] = {"description": f"TEI's {name}", "schema": {"type": "integer"}}
    return inference(summary, json_body(schema), ok, shape=ERRORS)


EMBEDDING = {"inputs": TEXTS, **TRUNCATION, **PROMPT_NAME}
SPARSE_VALUE = object_schema(["index", "value"], {"index": {"type": "integer"}, "value": {"type": "number"}})
LABELLED = object_schema(["label", "score"], {"label": {"type": "string"}, "score": {"type": "number"}})
EXAMPLE = {"inputs": ["What is Deep Learning?"]}
SCHEMAS: dict[str, Any] = {
    ERRORS.schema_name: ERRORS.schema,
    "EmbedRequest": object_schema(["inputs"], {**EMBEDDING, "normalize": FLAG, "dimensions": {
        "type": "integer", "minimum": 1, "nullable": True}}, example=EXAMPLE),
    "EmbedSparseRequest": object_schema(["inputs"], EMBEDDING, example=EXAMPLE),
    "EmbedAllRequest": object_schema(["inputs"], EMBEDDING, example=EXAMPLE),
    "RerankRequest": object_schema(["query", "texts"], {
        "query": TEXT, "texts": {"type": "array", "minItems": 1, "items": TEXT}, "raw_scores": FLAG,
        "return_text": FLAG, **TRUNCATION}, example={"query": "What is Deep Learning?",
                                                      "texts": ["Deep Learning is...", "Cheese is..."]}),
    "Rank": object_schema(["index", "score"], {"index": {"type": "integer", "minimum": 0},
                                               "score": {"type": "number"}, "text": {"type": "string"}}),
    "PredictRequest": object_schema(["inputs"], {
        "inputs": {"oneOf": [TEXT, {"type": "array", "minItems": 1, "maxItems": 2, "items": TEXT},
                             {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1,
                                                                        "maxItems": 2, "items": TEXT}}],
                   "description": "A text, a pair [text, text_pair], or a batch of [text] and [text, text_pair]"},
        "raw_scores": FLAG, **TRUNCATION}, example={"inputs": "I like you."}),
    "SimilarityRequest": object_schema(["inputs"], {
        "inputs": object_schema(["source_sentence", "sentences"], {
            "source_sentence": TEXT, "sentences": {"type": "array", "minItems": 1, "items": TEXT}}),
        "parameters": {"type": "object", "nullable": True, "properties": {**TRUNCATION, **PROMPT_NAME}}}),
    "TokenizeRequest": object_schema(["inputs"], {"inputs": TEXTS, "add_special_tokens": FLAG, **PROMPT_NAME},
                                     example={"inputs": "test"}),
    "DecodeRequest": object_schema(["ids"], {"ids": TOKEN_ID_LISTS,
                                             "skip_special_tokens": FLAG}, example={"ids": [101, 7592, 102]}),
    "SimpleToken": object_schema(["id", "text", "special"], {
        "id": {"type": "integer"}, "text": {"type": "string"}, "special": {"type": "boolean"},
        "start": {"type": "integer", "nullable": True, "description": "In code points"},
        "stop": {"type": "integer", "nullable": True}}),
    "Info": object_schema(["model_id", "model_dtype", "model_type", "max_input_length", "max_client_batch_size",
                           "version"], {
        "model_id": {"type": "string"}, "model_dtype": {"type": "string"}, "model_type": {"type": "object"},
        "max_concurrent_requests": {"type": "integer"}, "max_input_length": {"type": "integer"},
        "max_batch_tokens": {"type": "integer"}, "max_batch_requests": {"type": "integer", "nullable": True},
        "max_client_batch_size": {"type": "integer"}, "auto_truncate": {"type": "boolean"},
        "tokenization_workers": {"type": "integer"}, "version": {"type": "string"},
        "served_model_name": {"type": "string"}}),
}
PATHS: dict[str, Any] = {
    "/embed": tei_inference("TEI: embeddings, always a list of vectors (ZBATCH_TEI_MODEL)", "EmbedRequest",
                            answer("One vector per input", {"type": "array", "items": NUMBERS}, tokens=True)),
    "/embed_sparse": tei_inference(
        "TEI: sparse embeddings of a sparse-embeddings (SPLADE) model: per input, its vocabulary entries of "
        "weight above 0 (ZBATCH_TEI_SPARSE_MODEL)", "EmbedSparseRequest",
        answer("Entries per input", {"type": "array", "items": {"type": "array", "items": SPARSE_VALUE}},
               tokens=True)),
    "/embed_all": tei_inference(
        "TEI: per input, a vector for each of its tokens, unpooled (ZBATCH_TEI_MODEL)", "EmbedAllRequest",
        answer("Token vectors per input", {"type": "array", "items": {"type": "array", "items": NUMBERS}},
               tokens=True)),
    "/rerank": tei_inference("TEI: texts ranked against a query, highest score first (ZBATCH_TEI_RERANK_MODEL)",
                             "RerankRequest", answer("Ranks", {"type": "array", "items": ref("Rank")},
                                                     tokens=True)),
    "/predict": tei_inference(
        "TEI: every label and its score, highest first, for a text or pair; a list of those for a batch "
        "(ZBATCH_TEI_PREDICT_MODEL)", "PredictRequest",
        answer("Predictions", {"oneOf": [{"type": "array", "items": LABELLED},
                                         {"type": "array", "items": {"type": "array", "items": LABELLED}}]},
               tokens=True)),
    "/similarity": tei_inference("TEI: cosine similarity of each sentence with the source (ZBATCH_TEI_MODEL)",
                                 "SimilarityRequest", answer("One similarity per sentence", NUMBERS, tokens=True)),
    "/tokenize": tei_inference("TEI: each input's tokens (ZBATCH_TEI_MODEL)", "TokenizeRequest",
                               answer("Tokens per input", {"type": "array", "items": {
                                   "type": "array", "items": ref("SimpleToken")}}, tokens=True)),
    "/decode": tei_inference("TEI: the text of each list of token ids (ZBATCH_TEI_MODEL)", "DecodeRequest",
                             answer("One text per list of ids", {"type": "array", "items": {"type": "string"}},
                                    tokens=True)),
    "/info": get("TEI: the TEI model, as the workers describe it", answer("Info", ref("Info")),
                 *BROKER_QUERY_ERRORS, "unknown_model", shape=ERRORS),
    "/health": {"get": {"summary": "TEI: 200, no body, while a worker serves the TEI model",
                        "parameters": [{"$ref": "#/components/parameters/RequestId"}],
                        "responses": {"200": {"description": "Healthy"},
                                      **errors_for(*BROKER_QUERY_ERRORS, "no_worker", shape=ERRORS)}}},
}
ROUTES = (web.post("/embed", embed), web.post("/embed_sparse", embed_sparse), web.post("/embed_all", embed_all),
          web.post("/rerank", rerank), web.post("/predict", predict), web.post("/similarity", post_similarity),
          web.post("/tokenize", tokenize), web.post("/decode", decode), web.get("/info", info),
          web.get("/health", health))

DIALECT = Dialect(name="tei", title="TEI", routes=ROUTES, errors=ERRORS,
                  error_paths=frozenset(ROUTE_TASKS) - {"/"},  # POST /'s JSON only: the claim
                  openapi_paths=PATHS, openapi_schemas=SCHEMAS, answers=answers,
                  claims=(Claim("POST", "/", JSON_TYPES, root),), order=30)
