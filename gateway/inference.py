"""One inference request to the brokers, shared by every dialect: limits, the request, outputs and token counts.

A :class:`Call` is what a request needs whatever protocol carried it: the
gateway's settings, its broker client and catalog, the request's id,
deadline and priority.  An HTTP request makes one with :func:`call_of`, a
gRPC call (gateway/grpc/) from its metadata and deadline.

:func:`run` sends the inputs once and returns the worker's outputs with its
token counts (PROTOCOL.md 5.1: per input, the tokens the model took, for
every text task and ``tokenize``; none for images).  The counts are what a
caller is billed on: every dialect answers them where it has a place (OpenAI's
``usage``, TEI's ``x-compute-tokens``) and always in the ``X-Tokens`` header
(:func:`token_headers`).

With ``edge_tokenize`` on, where the model's workers announce a tokenizer, texts leave as token ids
(:mod:`zbatch.client.tokenizing`).  The payload is encoded once and the reply decoded once, as
:meth:`zbatch.client.AsyncClient.infer` does, but keeping ``tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.catalog import CATALOG, Catalog
from gateway.config import GatewayConfig
from gateway.metrics import MODEL
from gateway.parsing import check_limits, request_priority, request_timeout_ms
from gateway.tracing import REQUEST_ID
from zbatch.client import AsyncClient, WorkerError, raise_for_status
from zbatch.client.aio import sendable_payload
from zbatch.client.tokenizing import Send, TimeLeft, send_tokenized
from zbatch.protocol import payloads, vocabulary, wire
from zbatch.protocol.vocabulary import RUN

TOKENS_HEADER = "X-Tokens"


def _unnoted(model: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Call:
    """One request for a model, whatever carried it: where it goes, its id, deadline and priority.

    ``timeout_ms``: the caller's, within the gateway's own (None: the gateway's);
    ``noted``: told the model once known (the HTTP metrics label their request with it).
    """

    config: GatewayConfig
    client: AsyncClient
    catalog: Catalog
    request_id: str
    timeout_ms: int | None = None
    priority: int = wire.NORMAL_PRIORITY
    noted: Callable[[str], None] = _unnoted

    async def task_of(self, model: str) -> str | None:
        """The model's task as the catalog knows it (None: not known, the route lets it try)."""
        info = await self.catalog.lookup(self.client, model)
        return None if info is None else info.task


def call_of(request: web.Request) -> Call:
    """The call an HTTP request makes: its headers' deadline and priority, its id."""
    app = request.app
    return Call(app[CONFIG], app[CLIENT], app[CATALOG], request[REQUEST_ID], request_timeout_ms(request),
                request_priority(request), lambda model: request.__setitem__(MODEL, model))


@dataclass(frozen=True, slots=True)
class Result:
    """One output per input, in order, and per input its token count (None: the task counts none)."""

    outputs: list[Any]
    tokens: list[int] | None

    @property
    def total_tokens(self) -> int | None:
        return None if self.tokens is None else sum(self.tokens)


async def run(
    call: Call, model: str, inputs: list[Any], parameters: dict[str, Any], *,
    texts: Iterable[str] | None = None, operation: str = RUN,
) -> Result:
    """Run ``inputs`` through ``model`` at the call's priority and deadline.

    ``texts``: every text in the inputs, for the length limit; by default the inputs themselves
    (pass ``()`` for images and token ids, which the body size bounds).
    """
    check_limits(call.config, model, len(inputs), inputs if texts is None else texts)
    call.noted(model)
    send = _sender(call, model, operation)
    if operation == RUN and call.config.edge_tokenize:
        reply = await send_tokenized(call.catalog.tokenizers, call.catalog, call.client, model, inputs, parameters,
                                     send)
    else:
        reply = await send(inputs, parameters)
    raise_for_status(reply)
    try:
        answer = payloads.decode_payload(reply.payload)
        outputs, tokens = answer[vocabulary.OUTPUTS], answer.get(vocabulary.TOKENS)
    except (wire.ProtocolError, KeyError, TypeError) as exc:
        raise WorkerError(f"the worker sent an unreadable result ({exc})") from None
    if not isinstance(outputs, list) or len(outputs) != len(inputs):
        count = len(outputs) if isinstance(outputs, list) else "no list of"
        raise WorkerError(f"the worker returned {count} outputs for {len(inputs)} inputs")
    if not (isinstance(tokens, list) and len(tokens) == len(inputs) and all(type(t) is int for t in tokens)):
        tokens = None
    return Result(outputs, tokens)


def _sender(call: Call, model: str, operation: str) -> Send:
    """What sends one form of a request's inputs (texts, or the ids they became) to ``model`` for ``call``, each
    send within what is left of the call's time."""
    time_left = TimeLeft(call.timeout_ms, call.config.timeout_ms)

    async def send(inputs: list[Any], parameters: dict[str, Any]) -> wire.Reply:
        body: dict[str, Any] = {vocabulary.INPUTS: inputs, vocabulary.PARAMETERS: parameters}
        if operation != RUN:
            body[vocabulary.OPERATION] = operation
        return await call.client.request(model, sendable_payload(body), items=len(inputs),
                                         timeout_ms=time_left.next_ms(), priority=call.priority, trace=call.request_id)

    return send


def token_headers(result: Result) -> dict[str, str]:
    """``X-Tokens``: the request's tokens, for billing; absent when the task counts none (images)."""
    total = result.total_tokens
    return {} if total is None else {TOKENS_HEADER: str(total)}


def with_tokens(response: web.Response, result: Result) -> web.Response:
    """``response`` with the request's token count in ``X-Tokens``."""
    response.headers.update(token_headers(result))
    return response
