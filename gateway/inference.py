"""One inference request to the brokers, shared by every dialect: limits, the request, outputs and token counts.

:func:`run` sends the inputs once and returns the worker's outputs with its
token counts (PROTOCOL.md 5.1: per input, the tokens the model took, for
every text task and ``tokenize``; none for images).  The counts are what a
caller is billed on: every dialect answers them where it has a place (OpenAI's
``usage``, TEI's ``x-compute-tokens``) and always in the ``X-Tokens`` header
(:func:`token_headers`).

The payload is encoded once and the reply decoded once, as
:meth:`zbatch.client.AsyncClient.infer` does, but keeping ``tokens``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.metrics import MODEL
from gateway.parsing import check_limits, request_priority, request_timeout_ms
from gateway.tracing import REQUEST_ID
from zbatch.client import BadRequest, WorkerError, raise_for_status
from zbatch.protocol import payloads, wire

TOKENS_HEADER = "X-Tokens"
RUN, TOKENIZE = "run", "tokenize"


@dataclass(frozen=True, slots=True)
class Result:
    """One output per input, in order, and per input its token count (None: the task counts none)."""

    outputs: list[Any]
    tokens: list[int] | None

    @property
    def total_tokens(self) -> int | None:
        return None if self.tokens is None else sum(self.tokens)


async def run(
    request: web.Request, model: str, inputs: list[Any], parameters: dict[str, Any], *,
    texts: Iterable[str] | None = None, operation: str = RUN,
) -> Result:
    """Run ``inputs`` through ``model`` at the request's priority and deadline.

    ``texts``: every text in the inputs, for the length limit; by default the inputs themselves
    (pass ``()`` for images, which the body size bounds).
    """
    check_limits(request.app[CONFIG], model, len(inputs), inputs if texts is None else texts)
    request[MODEL] = model
    body: dict[str, Any] = {"inputs": inputs, "parameters": parameters}
    if operation != RUN:
        body["operation"] = operation
    try:
        payload = payloads.encode_payload(body)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequest(f"inputs or parameters cannot be sent: {exc}") from None
    reply = await request.app[CLIENT].request(
        model, payload, items=len(inputs), timeout_ms=request_timeout_ms(request),
        priority=request_priority(request), trace=request[REQUEST_ID],
    )
    raise_for_status(reply)
    try:
        answer = payloads.decode_payload(reply.payload)
        outputs, tokens = answer["outputs"], answer.get("tokens")
    except (wire.ProtocolError, KeyError, TypeError) as exc:
        raise WorkerError(f"the worker sent an unreadable result ({exc})") from None
    if not isinstance(outputs, list) or len(outputs) != len(inputs):
        count = len(outputs) if isinstance(outputs, list) else "no list of"
        raise WorkerError(f"the worker returned {count} outputs for {len(inputs)} inputs")
    if not (isinstance(tokens, list) and len(tokens) == len(inputs) and all(type(t) is int for t in tokens)):
        tokens = None
    return Result(outputs, tokens)


def token_headers(result: Result) -> dict[str, str]:
    """``X-Tokens``: the request's tokens, for billing; absent when the task counts none (images)."""
    total = result.total_tokens
    return {} if total is None else {TOKENS_HEADER: str(total)}


def with_tokens(response: web.Response, result: Result) -> web.Response:
    """``response`` with the request's token count in ``X-Tokens``."""
    response.headers.update(token_headers(result))
    return response
