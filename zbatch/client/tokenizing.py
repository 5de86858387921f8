"""Tokenizing at the edge: a sender turns a request's texts into token ids with the model's own tokenizer.

Theory of operation
-------------------
A worker is one process, and each text it tokenizes holds its interpreter;
its senders (the gateway's processes, a client's) can be many.  So a sender
that chooses to (the gateway's ``edge_tokenize``, on where ``zbatch serve``
runs its workers on GPUs; :class:`zbatch.client.AsyncClient`'s ``tokenize``)
tokenizes where it can, and the worker runs the ids (PROTOCOL.md 5.2, 5.3):

1. A worker whose model takes token ids exactly as it takes texts (an
   embeddings model with a fast tokenizer and no default prompt) names its
   tokenizer in READY by fingerprint (``tokenizer``, PROTOCOL.md 3.4); the
   brokers' STATS carry it (:mod:`zbatch.client.catalog`).
2. Once the fingerprint is known (the first request for a model a sender
   does not know yet starts a STATS refresh), the next request starts one
   fetch in the background: the
   ``tokenizer`` operation (one item, admitted as a caller's request is), whose
   answer must hash to the fingerprint announced.  Until it lands, and for
   :data:`RETRY_S` after a failed fetch, texts travel as texts.
3. Once fetched, a ``run`` request whose inputs are all texts becomes ids,
   untruncated, with the tokenizer's special tokens, and its parameters name
   the tokenizer (``tokenized_by``).  The worker truncates the ids as it would
   the text and refuses ids made with a tokenizer other than its own, so
   vectors and token counts are the same either way.
4. A model can change under its name (a rolling upgrade: for a while, workers
   of both tokenizers serve it, and the brokers' STATS name the newest).  A
   request sent as ids and refused with ``bad_request`` is therefore sent
   again as texts (:func:`send_tokenized`), whose answer is the worker's own;
   where the texts are answered, the ids were the cause, and the model's
   texts go as texts for :data:`RETRY_S`.  A request whose texts are refused
   too was bad as sent, and teaches nothing.

Texts stay texts where ids could differ or cost the sender too much: a request
naming a prompt, one with inputs that are not all texts (pairs, images, ids),
and one whose texts hold more than :data:`MAX_EDGE_CHARS` characters (the
tokenizer runs on the caller's event loop).  Tokenizers are kept by
fingerprint, at most :data:`MAX_TOKENIZERS`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import numpy as np

from zbatch.client.catalog import ModelCatalog, StatsSource
from zbatch.client.errors import ZBatchError, raise_for_status
from zbatch.protocol import payloads
from zbatch.protocol.messages import Reply
from zbatch.protocol.texts import TextEncoder
from zbatch.protocol.vocabulary import INPUTS, OPERATION, OUTPUTS, PROMPT_NAME, TOKENIZED_BY, TOKENIZER
from zbatch.protocol.wire import ProtocolError, Status

log = logging.getLogger("zbatch.client")

MAX_EDGE_CHARS: Final = 16_384  # about 4 ms of the loop's time on one core; longer requests go as text
MAX_TOKENIZERS: Final = 8
RETRY_S: Final = 30.0  # after a failed fetch or refused ids, a model's texts go as text this long
FETCH_TIMEOUT_MS: Final = 30_000

Send = Callable[[list[Any], dict[str, Any]], Awaitable[Reply]]


class Sender(StatsSource, Protocol):
    """What fetches a tokenizer and learns a model's: a broker client (:class:`zbatch.AsyncClient`)."""

    async def request(self, model: str, payload: bytes, *, items: int, timeout_ms: int | None = None,
                      priority: int = ..., trace: str = "") -> Reply: ...


class TimeLeft:
    """A request's timeout for each of its sends: as the caller gave it for the first; for a second (the texts
    after refused ids), what is left of it, so that a caller's deadline holds however many sends it takes.

    ``timeout_ms`` None: the broker's default, which ``default_ms`` (the client's own wait) matches."""

    def __init__(self, timeout_ms: int | None, default_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_ms, self._default_ms, self._clock = timeout_ms, default_ms, clock
        self._first: float | None = None

    def next_ms(self) -> int | None:
        """The timeout of the send about to go."""
        now = self._clock()
        if self._first is None:
            self._first = now
            return self._timeout_ms
        own_ms = self._default_ms if self._timeout_ms is None else self._timeout_ms
        return max(1, int(own_ms - (now - self._first) * 1000))


class Tokenizers:
    """The tokenizers this process fetched from the workers, by fingerprint, and the fetches under way.

    ``where`` names this process in its log lines ("the gateway", "this client")."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, where: str = "the gateway") -> None:
        # A sender's processes are its parallelism: the tokenizer's thread pool, woken for a request's few
        # texts, would spin beside them.  Set here, on the loop's thread, before any tokenizer runs (unless the
        # process already chose: the variable is the tokenizers library's, for the whole process).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._clock = clock
        self._where = where
        self._ready: dict[str, TextEncoder] = {}  # fingerprint → its tokenizer's encoder
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}  # by fingerprint: a failed fetch
        self._texts_until: dict[str, float] = {}  # by model: its workers refused ids that their texts passed
        self._unavailable = ""  # why this process cannot tokenize at all (no tokenizers package): never fetch
        self._closed = False

    def tokenized(self, client: Sender, model: str, fingerprint: str | None, inputs: list[Any],
                  parameters: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
        """``inputs`` as token ids and ``parameters`` naming their tokenizer, or None: send them as they are.

        ``fingerprint``: the tokenizer the model's workers announce (None or "": none)."""
        if (not fingerprint or self._unavailable or PROMPT_NAME in parameters
                or not all(type(item) is str for item in inputs)):
            return None
        if sum(len(item) for item in inputs) > MAX_EDGE_CHARS or self._clock() < self._texts_until.get(model, -1.0):
            return None
        encoder = self._ready.get(fingerprint)
        if encoder is None:
            self._start_fetch(client, model, fingerprint)
            return None
        try:
            encodings = encoder(inputs)
        except Exception:  # a text the tokenizer cannot take (a lone surrogate): the texts' path says what is wrong
            return None
        return [np.asarray(each.ids, dtype=np.int32) for each in encodings], {**parameters, TOKENIZED_BY: fingerprint}

    async def prepared(self, client: Sender, model: str, fingerprint: str | None) -> bool:
        """Whether texts for ``model`` will leave here as ids, once its tokenizer is fetched (at once if held)."""
        if not fingerprint or self._unavailable:
            return False
        if fingerprint not in self._ready:
            self._start_fetch(client, model, fingerprint)
            fetch = self._fetches.get(fingerprint)
            if fetch is not None:
                try:
                    await asyncio.shield(fetch)
                except asyncio.CancelledError:
                    if not fetch.cancelled():
                        raise  # the caller's own cancellation
                    return False  # closed meanwhile
        return fingerprint in self._ready and self._clock() >= self._texts_until.get(model, -1.0)

    def ids_refused(self, model: str, fingerprint: str, why: str) -> None:
        """The model's workers refused ids made with ``fingerprint`` and answered the same texts: texts a while."""
        if self._clock() >= self._texts_until.get(model, -1.0):
            log.warning("model %s: a worker refused ids made with tokenizer %s (%s); its texts go to the workers as "
                        "texts for %.0f s", model, fingerprint, why, RETRY_S)
        self._texts_until[model] = self._clock() + RETRY_S

    def _start_fetch(self, client: Sender, model: str, fingerprint: str) -> None:
        under_way = self._fetches.get(fingerprint)
        if under_way is not None and under_way.get_loop() is not asyncio.get_running_loop():
            del self._fetches[fingerprint]  # left by a loop that closed (a client used again on a new loop)
        if self._closed or fingerprint in self._fetches or self._clock() < self._retry_at.get(fingerprint, -1.0):
            return
        task = asyncio.get_running_loop().create_task(self._fetch(client, model, fingerprint))
        self._fetches[fingerprint] = task
        task.add_done_callback(lambda done: self._fetch_ended(fingerprint, done))

    def _fetch_ended(self, fingerprint: str, task: asyncio.Task[None]) -> None:
        if self._fetches.get(fingerprint) is task:  # not one a new loop's fetch replaced
            del self._fetches[fingerprint]

    async def _fetch(self, client: Sender, model: str, fingerprint: str) -> None:
        try:
            tokenizer_class = await asyncio.to_thread(_tokenizer_class)
        except ImportError as exc:  # before any fetch: a tokenizer this process cannot load is not worth one
            self._unavailable = str(exc)
            log.warning("texts go to the workers as texts: the tokenizers package cannot be imported here (%s); "
                        "install it (pip install tokenizers) or stop tokenizing in %s", exc, self._where)
            return
        try:
            serialized = await _fetched(client, model, fingerprint)
            encoder = await asyncio.to_thread(_loaded, tokenizer_class, serialized)
        except (ZBatchError, ValueError) as exc:
            self._retry_at[fingerprint] = self._clock() + RETRY_S
            log.warning("model %s: its tokenizer %s could not be fetched (%s); its texts go to the workers as "
                        "texts, and %s asks again in %.0f s", model, fingerprint, exc, self._where, RETRY_S)
            return
        while len(self._ready) >= MAX_TOKENIZERS:
            del self._ready[next(iter(self._ready))]
        self._ready[fingerprint] = encoder
        log.info("model %s: texts are tokenized in %s from now on (tokenizer %s)", model, self._where, fingerprint)

    async def close(self) -> None:
        """Cancel the fetches under way, and start none from now on."""
        self._closed = True
        for task in list(self._fetches.values()):
            task.cancel()
        await asyncio.gather(*self._fetches.values(), return_exceptions=True)


async def send_tokenized(tokenizers: Tokenizers, catalog: ModelCatalog, client: Sender, model: str,
                         inputs: list[Any], parameters: dict[str, Any], send: Send) -> Reply:
    """``send`` the inputs as token ids where :meth:`Tokenizers.tokenized` can with the tokenizer ``catalog`` knows
    the model's workers by, else as they are; ids refused with ``bad_request`` are sent again as they were given
    (the module's rule 4).  ``send`` encodes and sends one form of them."""
    info = catalog.known(client, model)
    fingerprint = None if info is None else info.tokenizer
    tokenized = tokenizers.tokenized(client, model, fingerprint, inputs, parameters)
    if tokenized is None:
        return await send(inputs, parameters)
    reply = await send(*tokenized)
    if reply.status is not Status.BAD_REQUEST:
        return reply
    as_given = await send(inputs, parameters)
    if as_given.status is not Status.BAD_REQUEST:
        assert fingerprint
        tokenizers.ids_refused(model, fingerprint, reply.message)
    return as_given


async def _fetched(client: Sender, model: str, fingerprint: str) -> str:
    """The serialized tokenizer the model's workers announce as ``fingerprint``; ValueError if the answer is not it."""
    payload = payloads.encode_payload({INPUTS: [fingerprint], OPERATION: TOKENIZER})
    reply = await client.request(model, payload, items=1, timeout_ms=FETCH_TIMEOUT_MS)
    raise_for_status(reply)
    try:
        answer = payloads.decode_payload(reply.payload)
        serialized = answer[OUTPUTS][0]
    except (ProtocolError, KeyError, TypeError, IndexError):
        raise ValueError("the worker's answer is not a list of outputs") from None
    if not isinstance(serialized, str) or payloads.tokenizer_fingerprint(serialized) != fingerprint:
        raise ValueError("the worker sent a tokenizer other than the one it announced")
    return serialized


def _tokenizer_class() -> Any:
    """``tokenizers.Tokenizer``; ImportError where the package is missing (a gateway host installed without it)."""
    from tokenizers import Tokenizer

    return Tokenizer


def _loaded(tokenizer_class: Any, serialized: str) -> TextEncoder:
    """The encoder of a ``tokenizers.Tokenizer`` from its JSON, truncation and padding off; ValueError if it is
    not one."""
    try:
        tokenizer = tokenizer_class.from_str(serialized)
    except Exception as exc:  # the library raises plain Exception for a JSON it cannot read
        raise ValueError(f"the tokenizer cannot be read ({str(exc)[:200]})") from None
    encoder = TextEncoder(tokenizer)
    encoder.limit(None)
    return encoder
