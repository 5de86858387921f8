"""Hugging Face Text Embeddings Inference (TEI): its routes, request and response shapes, statuses and headers.

A TEI server serves one model; the gateway puts one model behind each TEI
route, from its settings (``GatewayConfig.tei_models``): ``ZBATCH_TEI_MODEL``
(default: the default model) answers ``/embed``, ``/similarity``, ``/tokenize``,
``/info`` and ``/health``; ``ZBATCH_TEI_RERANK_MODEL`` ``/rerank`` and
``ZBATCH_TEI_PREDICT_MODEL`` ``/predict`` (both default to the TEI model).  A
route whose model does another task answers TEI's 424, naming the routes
that answer that task and the setting to change.

Answers carry TEI's ``x-compute-tokens`` and ``x-compute-characters`` (and the
gateway's ``X-Tokens``); errors are TEI's ``{"error": str, "error_type": str}``
with TEI's statuses (gateway/errors.py, the table's ``tei`` column).
Differences from TEI: token ids as inputs and ``prompt_name`` are refused, and
``/tokenize`` offsets count code points (PROTOCOL.md 5.3).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.appkeys import CATALOG, CLIENT, CONFIG
from gateway.catalog import ModelInfo, fleet_stats
from gateway.dialects.huggingface import similarity, similarity_inputs, task_of
from gateway.errors import ApiError, bad_request
from gateway.inference import TOKENIZE, Result, run, token_headers
from gateway.parsing import model_options, optional_flag, read_json
from gateway.responses import VERSION, json_response
from gateway.tasks import CLASSIFICATION, EMBEDDINGS, RERANK, is_text_task, require_task

TRUNCATION = ("truncate", "truncation_direction")
SETTINGS = {"/rerank": "ZBATCH_TEI_RERANK_MODEL", "/predict": "ZBATCH_TEI_PREDICT_MODEL"}
MAIN_SETTING = "ZBATCH_TEI_MODEL"


def route_model(request: web.Request) -> str:
    """The model behind this TEI route."""
    return request.app[CONFIG].tei_models[request.path]


async def checked_model(request: web.Request, needed: set[str] | frozenset[str]) -> str:
    """The route's model, after refusing one known to do another task (424, naming the setting)."""
    model = route_model(request)
    setting = SETTINGS.get(request.path, MAIN_SETTING)
    require_task(model, await task_of(request, model), needed, request.path, setting)
    return model


def tei_answer(value: Any, result: Result, texts: list[str]) -> web.Response:
    """TEI's answer: the JSON, its token and character counts in TEI's headers, and ``X-Tokens``."""
    response = json_response(value)
    response.headers["x-compute-characters"] = str(sum(map(len, texts)))
    response.headers.update(token_headers(result))
    if result.total_tokens is not None:
        response.headers["x-compute-tokens"] = str(result.total_tokens)
    return response


def strings(value: Any, field: str) -> tuple[list[str], bool]:
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
    return texts, single


async def embed(request: web.Request) -> web.Response:
    """``POST /embed``: ``{"inputs", "normalize", "dimensions", "truncate", "truncation_direction"}`` ->
    one vector per input, always a list of vectors."""
    body = await read_json(request)
    texts, _ = strings(body.get("inputs"), "inputs")
    parameters = model_options(body, ("normalize", "dimensions", *TRUNCATION, "prompt_name"))
    model = await checked_model(request, {EMBEDDINGS})
    result = await run(request, model, texts, parameters)
    return tei_answer(result.outputs, result, texts)


async def rerank(request: web.Request) -> web.Response:
    """``POST /rerank``: ``{"query", "texts", "raw_scores", "return_text", "truncate", ...}`` ->
    ``[{"index", "score", "text"?}]``, highest score first."""
    body = await read_json(request)
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request('"query" must be a non-empty string')
    texts, _ = strings(body.get("texts"), "texts")
    return_text = optional_flag(body, "return_text")
    parameters = model_options(body, ("raw_scores", *TRUNCATION))
    model = await checked_model(request, {RERANK})
    result = await run(request, model, [[query, text] for text in texts], parameters, texts=[query, *texts])
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
    parameters = model_options(body, ("raw_scores", *TRUNCATION))
    model = await checked_model(request, CLASSIFICATION)
    texts = [text for item in inputs for text in ([item] if isinstance(item, str) else item)]
    result = await run(request, model, list(inputs), parameters, texts=texts)
    return tei_answer(result.outputs[0] if single else result.outputs, result, texts)


async def post_similarity(request: web.Request) -> web.Response:
    """``POST /similarity``: ``{"inputs": {"source_sentence", "sentences"}, "parameters"}`` -> cosine similarities."""
    body = await read_json(request)
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise bad_request('"inputs" must be an object: {"source_sentence": str, "sentences": [str]}')
    source, sentences = similarity_inputs(inputs)
    options = body.get("parameters") or {}
    if not isinstance(options, dict):
        raise bad_request('"parameters" must be an object')
    parameters = model_options(options, (*TRUNCATION, "prompt_name"))
    model = await checked_model(request, {EMBEDDINGS})
    scores, result = await similarity(request, model, source, sentences, parameters, request.path)
    return tei_answer(scores, result, [source, *sentences])


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``{"inputs", "add_special_tokens"}`` -> per input its tokens
    ``{"id", "text", "special", "start", "stop"}`` (offsets in code points)."""
    body = await read_json(request)
    texts, _ = strings(body.get("inputs"), "inputs")
    parameters = model_options(body, ("add_special_tokens", "prompt_name"))
    model = route_model(request)
    if not is_text_task(await task_of(request, model)):
        raise ApiError("wrong_task", f"/tokenize needs a text model, but {model!r} takes images; point "
                                     f"{MAIN_SETTING} at a text model")
    result = await run(request, model, texts, parameters, operation=TOKENIZE)
    return tei_answer(result.outputs, result, texts)


def model_type(info: ModelInfo) -> dict[str, Any]:
    """TEI's ``model_type``: embedding (mean pooling, as the workers pool), reranker or classifier."""
    labels = {str(index): label for index, label in enumerate(info.labels or ())}
    by_label = {label: index for index, label in enumerate(info.labels or ())}
    if info.task == EMBEDDINGS:
        return {"embedding": {"pooling": "mean"}}
    if info.task == RERANK:
        return {"reranker": {"id2label": labels, "label2id": by_label}}
    if info.task in CLASSIFICATION:
        return {"classifier": {"id2label": labels, "label2id": by_label}}
    return {str(info.task): {}}


async def info(request: web.Request) -> web.Response:
    """``GET /info``: TEI's description of the TEI model, with what the workers said of it in READY.

    ``max_batch_requests`` is the model's batch size on its worker, ``max_batch_tokens`` that times
    its longest input, ``tokenization_workers`` the workers serving it.
    """
    model = route_model(request)
    found = await request.app[CATALOG].lookup(request.app[CLIENT], model)
    if found is None:
        raise ApiError("unknown_model", f"no broker knows {model!r}, the model of TEI's routes "
                                        f"({MAIN_SETTING}); start a worker for it")
    config = request.app[CONFIG]
    batch, longest = found.max_batch_size, found.max_length
    return json_response({
        "model_id": model, "model_sha": None, "model_dtype": found.dtype or "unknown",
        "model_type": model_type(found), "max_concurrent_requests": config.max_connections,
        "max_input_length": longest or 0, "max_batch_tokens": (batch or 0) * (longest or 0),
        "max_batch_requests": batch, "max_client_batch_size": config.max_inputs, "auto_truncate": True,
        "tokenization_workers": found.workers, "version": VERSION, "sha": None, "docker_label": None,
        "served_model_name": model,
    })


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 with no body while a worker serves the TEI model, else 503 ``Unhealthy``."""
    model = route_model(request)
    figures = (await fleet_stats(request)).get("models", {}).get(model)
    if not figures or figures.get("workers", 0) < 1:
        raise ApiError("no_worker", f"no worker serves {model!r}, the model of TEI's routes ({MAIN_SETTING})")
    return web.Response(status=200)
