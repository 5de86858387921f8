"""What the gateway knows of each model: its task and READY's details, from the brokers' STATS, kept briefly.

The dialects need a model's task (to refuse a route it cannot answer, to
read a JSON string as text or as a base64 image) and its details (TEI's
``/info``, KServe's metadata, OpenAI's model list).  Asking the brokers on
every request would add a round trip to the hot path, so :class:`Catalog`
keeps the last answer: a known model is looked up in a dict, and once the
answer is older than :data:`FRESH_S` one refresh starts in the background
while requests go on with what is known.  Only a model not in the catalog
waits for a refresh (for at most :data:`MISS_WAIT_S`), at most one every
:data:`RETRY_S`, so a flood of requests for unknown names costs the brokers
one STATS per interval.

It also gives the default model of a gateway whose settings name none
(``default_model``, else the first of ``models``): the one model a worker
serves (:func:`followed_default`), so that ``POST /``, TEI's routes and
``/readyz`` follow the model the workers were started with, wherever it was
set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT
from gateway.config import GatewayConfig
from gateway.edge import EdgeTokenizers
from gateway.errors import ApiError
from zbatch.client import AsyncClient, ZBatchError
from zbatch.client.stats import merge_stats
from zbatch.protocol.vocabulary import EMBEDDINGS

FRESH_S = 2.0  # a catalog older than this is refreshed in the background
RETRY_S = 0.5  # an unknown model waits for a refresh at most this often
MISS_WAIT_S = 0.25  # and for at most this long: a hung broker must not hold requests up
STATS_TIMEOUT_MS = 1000


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model as the brokers see it: how many workers serve it, and what its newest worker said of it.

    Every detail is None when unknown (no worker yet, or a worker that did not say).
    """

    name: str
    workers: int
    task: str | None = None
    max_batch_size: int | None = None
    max_length: int | None = None
    dimensions: int | None = None
    dtype: str | None = None
    labels: tuple[str, ...] | None = None
    tokenizer: str | None = None  # the fingerprint of the tokenizer the gateway may tokenize with (gateway.edge)
    max_batch_tokens: int | None = None  # most tokens one forward pass runs, where the worker bounds it

    @classmethod
    def from_stats(cls, name: str, figures: Mapping[str, Any]) -> ModelInfo:
        """From one model's figures in a STATS answer (PROTOCOL.md 3.6): its ``workers`` and ``info``."""
        info = figures.get("info") or {}
        labels = info.get("labels")
        return cls(name, int(figures.get("workers", 0)), info.get("task"), info.get("max_batch_size"),
                   info.get("max_length"), info.get("dimensions"), info.get("dtype"),
                   tuple(labels) if isinstance(labels, list) else None, info.get("tokenizer"),
                   info.get("max_batch_tokens"))


def models_of(stats: Mapping[str, Any]) -> dict[str, ModelInfo]:
    """Every model of a (merged) STATS answer."""
    return {name: ModelInfo.from_stats(name, figures) for name, figures in stats.get("models", {}).items()}


class Catalog:
    """The models of the last STATS answer, refreshed as described in the module's docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._models: dict[str, ModelInfo] = {}
        self._taken_at = -math.inf
        self._failure: ZBatchError | None = None  # why the last refresh got no answer, if it did not
        self._refresh: asyncio.Task[None] | None = None
        self.tokenizers = EdgeTokenizers(clock)

    def update(self, stats: Mapping[str, Any]) -> dict[str, ModelInfo]:
        """Take a fresh STATS answer (the model list handlers ask for one anyway); returns its models."""
        self._models = models_of(stats)
        self._taken_at = self._clock()
        self._failure = None
        return self._models

    async def lookup(self, client: AsyncClient, model: str) -> ModelInfo | None:
        """``model``'s info: at once if known; else after a refresh, unless one ran within RETRY_S."""
        info = self._models.get(model)
        age = self._clock() - self._taken_at
        if info is not None:
            if age > FRESH_S:
                self._start_refresh(client)
            return info
        if age > RETRY_S:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._start_refresh(client)), MISS_WAIT_S)
            return self._models.get(model)
        return None

    def known(self, client: AsyncClient, model: str) -> ModelInfo | None:
        """``model``'s info if known, never waiting (a stale catalog starts its refresh, as :meth:`lookup` does)."""
        if self._clock() - self._taken_at > FRESH_S:
            self._start_refresh(client)
        return self._models.get(model)

    async def default_model(self, client: AsyncClient) -> str:
        """The model a request that names none goes to where the settings name no default: the one model a worker
        serves (:func:`followed_default`).  Known models answer at once; with none known, a refresh is awaited
        as for an unknown model."""
        age = self._clock() - self._taken_at
        if not served_models(self._models) and age > RETRY_S:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._start_refresh(client)), MISS_WAIT_S)
        elif age > FRESH_S:
            self._start_refresh(client)
        if self._failure is not None and not served_models(self._models):
            raise self._failure  # no broker answers: that, rather than "no worker"
        return followed_default(self._models)

    def _start_refresh(self, client: AsyncClient) -> asyncio.Task[None]:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._fetch(client))
        return self._refresh

    async def _fetch(self, client: AsyncClient) -> None:
        try:
            self.update(merge_stats(await client.stats_by_broker(timeout_ms=STATS_TIMEOUT_MS)))
        except ZBatchError as exc:
            self._taken_at = self._clock()  # no broker answered: keep what is known, ask again later
            self._failure = exc

    async def close(self) -> None:
        """Cancel a refresh and tokenizer fetches in flight (the application is shutting down)."""
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
        await self.tokenizers.close()


CATALOG = web.AppKey("catalog", Catalog)


async def fleet_stats(request: web.Request) -> dict[str, Any]:
    """Every broker's statistics in one view (zbatch/client/stats.py), which also refreshes the catalog.

    Raises the error of the first broker if none answers.
    """
    stats = merge_stats(await request.app[CLIENT].stats_by_broker())
    request.app[CATALOG].update(stats)
    return stats


async def default_model(request: web.Request, named: str) -> str:
    """``named`` (a route's model as the settings name it), else the one model the brokers serve."""
    return named or await request.app[CATALOG].default_model(request.app[CLIENT])


def readiness(stats: Mapping[str, Any] | Exception, required: tuple[str, ...]) -> str:
    """``ready``, or why one broker is not: it does not answer, it drains, or a required model has no worker
    (none required: no model has one)."""
    if isinstance(stats, Exception):
        return f"not answering ({stats})"
    if stats.get("draining"):
        return "draining"
    if not required:
        return "ready" if served_models(models_of(stats)) else "no worker serves any model yet"
    missing = [m for m in required if worker_count(stats, m) < 1]
    return f"no worker serves {', '.join(missing)}" if missing else "ready"


def served_models(models: Mapping[str, ModelInfo]) -> list[str]:
    """The models a worker serves now, by name."""
    return sorted(name for name, info in models.items() if info.workers > 0)


def followed_default(models: Mapping[str, ModelInfo]) -> str:
    """The default model of a gateway whose settings name none: the one model a worker serves, or among several
    the one embeddings model (a worker that serves a reranker or a classifier beside its embeddings model, as
    ``--extra-models`` adds them: those are reached by their own routes or by name).

    With none, ``no_worker``; with several and no single embeddings model, ``bad_request`` asking the caller to
    name one, since which of them a request meant cannot be known.
    """
    served = served_models(models)
    embedders = [name for name in served if models[name].task == EMBEDDINGS]
    if len(served) == 1:
        return served[0]
    if len(embedders) == 1:
        return embedders[0]
    if not served:
        raise ApiError("no_worker", "no worker serves a model yet: the default model is the one the workers serve; "
                                    "retry once one has started")
    raise ApiError("bad_request", f"the workers serve several models ({', '.join(served)}) and the gateway names no "
                                  f"default: name the model (POST /models/{{model}}), or set ZBATCH_DEFAULT_MODEL")


def followed_config(config: GatewayConfig, models: Mapping[str, ModelInfo]) -> GatewayConfig:
    """``config`` with the default model it follows filled in, where its settings name none and one is served."""
    if config.named_default_model or len(served_models(models)) != 1:
        return config
    return dataclasses.replace(config, default_model=followed_default(models))


def worker_count(stats: Mapping[str, Any], model: str) -> int:
    """How many workers the broker has for ``model`` (0 for a model it does not know)."""
    return int(stats.get("models", {}).get(model, {}).get("workers", 0))
