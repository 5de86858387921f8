"""Tokenizing at the edge: the gateway turns a request's texts into token ids with the model's own tokenizer.

Theory of operation
-------------------
On a GPU host a worker is one process, and each text it tokenizes holds its
interpreter; the gateway's processes scale with the host's cores.  So with
``edge_tokenize`` on (off by default: on a host whose daemons share few cores
it costs the gateway more than it saves the worker; ``zbatch serve`` turns it
on where its workers run on GPUs), the gateway tokenizes where it can, and
the worker runs the ids (PROTOCOL.md 5.2, 5.3):

1. A worker whose model takes token ids exactly as it takes texts (an
   embeddings model with a fast tokenizer and no default prompt) names its
   tokenizer in READY by fingerprint (``tokenizer``, PROTOCOL.md 3.4); the
   catalog (:mod:`gateway.catalog`) carries it.
2. The first request for such a model starts one fetch in the background: the
   ``tokenizer`` operation (one item, admitted as a caller's request is), whose
   answer must hash to the fingerprint announced.  Until it lands, and for
   :data:`RETRY_S` after a failed fetch, texts travel as texts.
3. Once fetched, a ``run`` request whose inputs are all texts becomes ids,
   untruncated, with the tokenizer's special tokens, and its parameters name
   the tokenizer (``tokenized_by``).  The worker truncates the ids as it would
   the text and refuses ids made with a tokenizer other than its own, so
   vectors and token counts are the same either way.

Texts stay texts where ids could differ or cost the loop too much: a request
naming a prompt, one with inputs that are not all texts (pairs, images, ids),
and one whose texts hold more than :data:`MAX_EDGE_CHARS` characters (the
tokenizer runs on the event loop).  Tokenizers are kept by fingerprint, at
most :data:`MAX_TOKENIZERS`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from zbatch.client import AsyncClient, ZBatchError, raise_for_status
from zbatch.protocol import payloads
from zbatch.protocol.vocabulary import INPUTS, OPERATION, OUTPUTS, PROMPT_NAME, TOKENIZED_BY, TOKENIZER
from zbatch.protocol.wire import ProtocolError

log = logging.getLogger("zbatch.gateway")

MAX_EDGE_CHARS: Final = 16_384  # about 4 ms of the loop's time on one core; longer requests go as text
MAX_TOKENIZERS: Final = 8
RETRY_S: Final = 30.0  # after a failed fetch, texts go as text this long before the next try
FETCH_TIMEOUT_MS: Final = 30_000


class EdgeTokenizers:
    """The tokenizers this process fetched from the workers, by fingerprint, and the fetches under way."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # The gateway's processes are its parallelism: the tokenizer's thread pool, woken for a request's few
        # texts, would spin beside them.  Set here, on the loop's thread, before any tokenizer runs.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._clock = clock
        self._ready: dict[str, Any] = {}  # fingerprint → tokenizers.Tokenizer
        self._fetches: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._unavailable = ""  # why this process cannot tokenize at all (no tokenizers package): never fetch

    def tokenized(self, client: AsyncClient, model: str, fingerprint: str | None, inputs: list[Any],
                  parameters: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
        """``inputs`` as token ids and ``parameters`` naming their tokenizer, or None: send them as they are.

        ``fingerprint``: the tokenizer the model's workers announce (None or "": none)."""
        if (not fingerprint or self._unavailable or PROMPT_NAME in parameters
                or not all(type(item) is str for item in inputs)):
            return None
        if sum(len(item) for item in inputs) > MAX_EDGE_CHARS:
            return None
        tokenizer = self._ready.get(fingerprint)
        if tokenizer is None:
            self._start_fetch(client, model, fingerprint)
            return None
        ids = [np.asarray(each.ids, dtype=np.int32) for each in payloads.encode_without_offsets(tokenizer)(inputs)]
        return ids, {**parameters, TOKENIZED_BY: fingerprint}

    def _start_fetch(self, client: AsyncClient, model: str, fingerprint: str) -> None:
        if fingerprint in self._fetches or self._clock() < self._retry_at.get(fingerprint, -1.0):
            return
        task = asyncio.get_running_loop().create_task(self._fetch(client, model, fingerprint))
        self._fetches[fingerprint] = task
        task.add_done_callback(lambda _: self._fetches.pop(fingerprint, None))

    async def _fetch(self, client: AsyncClient, model: str, fingerprint: str) -> None:
        try:
            tokenizer_class = await asyncio.to_thread(_tokenizer_class)
        except ImportError as exc:  # before any fetch: a tokenizer this process cannot load is not worth one
            self._unavailable = str(exc)
            log.warning("texts go to the workers as texts: the tokenizers package cannot be imported here (%s); "
                        "install it (pip install tokenizers) or turn edge_tokenize off", exc)
            return
        try:
            serialized = await _fetched(client, model, fingerprint)
            tokenizer = await asyncio.to_thread(_loaded, tokenizer_class, serialized)
        except (ZBatchError, ValueError) as exc:
            self._retry_at[fingerprint] = self._clock() + RETRY_S
            log.warning("model %s: its tokenizer %s could not be fetched (%s); its texts go to the workers as "
                        "texts, and the gateway asks again in %.0f s", model, fingerprint, exc, RETRY_S)
            return
        while len(self._ready) >= MAX_TOKENIZERS:
            del self._ready[next(iter(self._ready))]
        self._ready[fingerprint] = tokenizer
        log.info("model %s: texts are tokenized in the gateway from now on (tokenizer %s)", model, fingerprint)

    async def close(self) -> None:
        for task in list(self._fetches.values()):
            task.cancel()
        await asyncio.gather(*self._fetches.values(), return_exceptions=True)


async def _fetched(client: AsyncClient, model: str, fingerprint: str) -> str:
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


def _loaded(tokenizer_class: Any, serialized: str) -> Any:
    """A ``tokenizers.Tokenizer`` from its JSON, truncation and padding off; ValueError if it is not one."""
    try:
        tokenizer = tokenizer_class.from_str(serialized)
    except Exception as exc:  # the library raises plain Exception for a JSON it cannot read
        raise ValueError(f"the tokenizer cannot be read ({str(exc)[:200]})") from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
