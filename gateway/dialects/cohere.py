"""Cohere's rerank, which Jina's, infinity's and vLLM's servers answer too: ``POST /v1/rerank`` and ``/v2/rerank``.

What ``cohere.Client(base_url=...).rerank`` (``/v1``) and ``cohere.ClientV2``
(``/v2``) send, and LangChain's ``CohereRerank``, LlamaIndex's and Jina's
clients: ``{"model", "query", "documents", "top_n", "return_documents"}``.

* ``model``: a ``rerank`` model by name (required, as Cohere's v2, Jina's and
  infinity's; a model of another task is a 400 naming the routes of its task).
* ``documents``: strings, or objects whose ``text`` is ranked (Cohere's v1 and
  Jina's); at most the gateway's ``max_inputs``.
* ``top_n``: the best N (default: all); ``return_documents``: each result
  carries its ``document`` (``{"text"}``, or the object sent).
* Accepted and not used: ``max_chunks_per_doc`` (v1) and ``max_tokens_per_doc``
  (v2): the workers cut each (query, document) pair at the model's maximum
  length instead of chunking; vLLM's ``truncate_prompt_tokens`` (-1 only, as
  its embeddings, gateway/parsing.py).  ``rank_fields`` other than ``["text"]``
  is refused: only the text is ranked.

The answer: ``results`` sorted by ``relevance_score`` (the model's sigmoid
score, in [0, 1]), each with its ``index`` in ``documents``; ``meta`` as
Cohere's (its API version, ``billed_units.search_units``: one per query and
100 documents, as Cohere counts them, and ``tokens.input_tokens``), and
``usage`` as Jina's, infinity's and vLLM's (``prompt_tokens``,
``total_tokens``): the tokens the model took, which ``X-Tokens`` says too.

Errors are Cohere's ``{"message"}``, with Cohere's statuses, which its client turns into its own exceptions: 400 for
every invalid request, too many documents included; 429 when overloaded;
500 when a worker fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.appkeys import CONFIG
from gateway.config import GatewayConfig
from gateway.dialects import Dialect, require_task
from gateway.errors import ERRORS as CODES
from gateway.errors import ApiError, ErrorCode, ErrorShape, bad_request
from gateway.inference import call_of, run, with_tokens
from gateway.openapi_parts import EXAMPLE_MODEL, FLAG, TEXT, answer, inference, json_body, object_schema, ref
from gateway.parsing import optional_flag, read_json, truncate_prompt_tokens
from gateway.responses import json_response
from gateway.tracing import REQUEST_ID
from zbatch.protocol.vocabulary import RERANK
from zbatch.protocol.wire import MAX_NAME_CHARS

DOCUMENTS_PER_SEARCH_UNIT = 100  # Cohere bills a search unit per query with up to 100 documents
# Cohere's status of the gateway's codes, where it differs from the gateway's own.
STATUSES = {"too_many_inputs": 400, "overloaded": 429, "worker_error": 500, "worker_lost": 500,
            "upstream_error": 500}
ROUTES_BY_VERSION = {"/v1/rerank": "1", "/v2/rerank": "2"}


def cohere_status(error: ErrorCode) -> int:
    return STATUSES.get(error.code, error.status)


def error_answer(error: ApiError) -> tuple[int, Any]:
    """Cohere's shape; an error whose status was overridden (an aiohttp refusal) keeps it."""
    status = cohere_status(CODES[error.code]) if error.status == CODES[error.code].status else error.status
    return status, {"message": error.message}


ERRORS = ErrorShape("CohereError", object_schema(["message"], {"message": {"type": "string"}}), error_answer,
                     cohere_status)


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """A rerank request, checked: the texts to rank are each document's text."""

    model: str
    query: str
    documents: list[Any]
    texts: list[str]
    top_n: int | None
    return_documents: bool


def document_texts(documents: Any, config: GatewayConfig) -> list[str]:
    """Each document's text: the document itself, or its ``text``; at most ``max_inputs`` of them."""
    if not isinstance(documents, list) or not documents:
        raise bad_request('"documents" must be a non-empty list of strings, or of objects with a "text" string',
                          param="documents")
    if len(documents) > config.max_inputs:
        raise ApiError("too_many_inputs", f"{len(documents)} documents; the limit is {config.max_inputs} per "
                                          "request: split them", param="documents")
    texts = []
    for index, document in enumerate(documents):
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise bad_request(f"documents[{index}] must be a string, or an object with a \"text\" string",
                              param="documents")
        texts.append(text)
    return texts


def whole_number(body: dict[str, Any], name: str) -> int | None:
    """An optional field that must be a whole number of at least 1."""
    value = body.get(name)
    if value is not None and (type(value) is not int or value < 1):
        raise bad_request(f'"{name}" must be a whole number of at least 1', param=name)
    return value


def parse_rerank(body: dict[str, Any], config: GatewayConfig) -> RerankRequest:
    """The request's fields, checked; those zbatch does not use are checked and left (see the module's doc)."""
    model, query = body.get("model"), body.get("query")
    if not isinstance(model, str) or not 1 <= len(model) <= MAX_NAME_CHARS:
        raise bad_request(f'"model" must be the name of a rerank model, a string of 1 to {MAX_NAME_CHARS} '
                          "characters; GET /v1/models lists those served", param="model")
    if not isinstance(query, str) or not query:
        raise bad_request('"query" must be a non-empty string', param="query")
    if body.get("rank_fields") not in (None, ["text"]):
        raise bad_request('"rank_fields" may only be ["text"]: zbatch ranks each document\'s text',
                          param="rank_fields")
    for unused in ("max_chunks_per_doc", "max_tokens_per_doc"):
        whole_number(body, unused)
    truncate_prompt_tokens(body)
    texts = document_texts(body.get("documents"), config)
    return RerankRequest(model, query, body["documents"], texts, whole_number(body, "top_n"),
                         bool(optional_flag(body, "return_documents")))


def result(index: int, score: float, document: Any | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "relevance_score": score}
    if document is not None:
        entry["document"] = document if isinstance(document, dict) else {"text": document}
    return entry


async def post_rerank(request: web.Request) -> web.Response:
    """``POST /v1/rerank`` and ``/v2/rerank``: the documents ranked against the query, most relevant first."""
    asked = parse_rerank(await read_json(request), request.app[CONFIG])
    call = call_of(request)
    require_task(asked.model, await call.task_of(asked.model), {RERANK}, f"POST {request.path}")
    ranked = await run(call, asked.model, [[asked.query, text] for text in asked.texts], {},
                       texts=[asked.query, *asked.texts])
    scores = [float(score) for score in ranked.outputs]
    order = sorted(range(len(scores)), key=lambda index: scores[index], reverse=True)[:asked.top_n]
    tokens = ranked.total_tokens or 0
    searches = math.ceil(len(asked.texts) / DOCUMENTS_PER_SEARCH_UNIT)
    return with_tokens(json_response({
        "id": request[REQUEST_ID], "model": asked.model,
        "results": [result(index, scores[index], asked.documents[index] if asked.return_documents else None)
                    for index in order],
        "meta": {"api_version": {"version": ROUTES_BY_VERSION[request.path]},
                 "billed_units": {"search_units": searches}, "tokens": {"input_tokens": tokens}},
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }), ranked)


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    return [f"POST {path}" for path in ROUTES_BY_VERSION] if task == RERANK else []


DOCUMENT = {"oneOf": [{"type": "string"}, object_schema(["text"], {"text": {"type": "string"}})]}
COUNT = {"type": "integer", "minimum": 1, "nullable": True}
SCHEMAS: dict[str, Any] = {
    ERRORS.schema_name: ERRORS.schema,
    "CohereRerankRequest": object_schema(["model", "query", "documents"], {
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}, "query": TEXT,
        "documents": {"type": "array", "minItems": 1, "items": DOCUMENT},
        "top_n": {**COUNT, "description": "The best N only (default: all)"},
        "return_documents": {**FLAG, "description": "Each result carries its document"},
        "rank_fields": {"type": "array", "items": {"type": "string", "enum": ["text"]}, "nullable": True},
        "max_chunks_per_doc": {**COUNT, "description": "Accepted, not used: pairs are cut at the model's maximum"},
        "max_tokens_per_doc": {**COUNT, "description": "Accepted, not used: pairs are cut at the model's maximum"},
        "truncate_prompt_tokens": {"type": "integer", "enum": [-1], "nullable": True,
                                   "description": "vLLM's: -1 only (cut at the model's maximum, as always)"}},
        example={"model": EXAMPLE_MODEL, "query": "What is Deep Learning?",
                 "documents": ["Deep Learning is...", "Cheese is..."], "top_n": 1, "return_documents": True}),
    "CohereRerankResponse": object_schema(["id", "results", "meta"], {
        "id": {"type": "string"}, "model": {"type": "string"},
        "results": {"type": "array", "items": object_schema(["index", "relevance_score"], {
            "index": {"type": "integer", "minimum": 0}, "relevance_score": {"type": "number"},
            "document": {"type": "object"}})},
        "meta": {"type": "object"},
        "usage": object_schema(["prompt_tokens", "total_tokens"], {
            "prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}})}),
}
PATHS: dict[str, Any] = {
    path: inference(f"Cohere (v{version}), Jina, infinity and vLLM: documents ranked against a query by a rerank "
                    "model, most relevant first", json_body("CohereRerankRequest"),
                    answer("Ranked documents", ref("CohereRerankResponse"), tokens=True), shape=ERRORS)
    for path, version in ROUTES_BY_VERSION.items()
}

DIALECT = Dialect(
    name="cohere", title="Cohere", routes=tuple(web.post(path, post_rerank) for path in ROUTES_BY_VERSION),
    errors=ERRORS, error_paths=frozenset(ROUTES_BY_VERSION), openapi_paths=PATHS, openapi_schemas=SCHEMAS,
    answers=answers, order=25,
)
