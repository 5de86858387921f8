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
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.appkeys import CATALOG, CLIENT
from zbatch.client import AsyncClient, ZBatchError
from zbatch.client.stats import merge_stats

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

    @classmethod
    def from_stats(cls, name: str, figures: Mapping[str, Any]) -> ModelInfo:
        """From one model's figures in a STATS answer (PROTOCOL.md 3.6): its ``workers`` and ``info``."""
        info = figures.get("info") or {}
        labels = info.get("labels")
        return cls(name, int(figures.get("workers", 0)), info.get("task"), info.get("max_batch_size"),
                   info.get("max_length"), info.get("dimensions"), info.get("dtype"),
                   tuple(labels) if isinstance(labels, list) else None)


def models_of(stats: Mapping[str, Any]) -> dict[str, ModelInfo]:
    """Every model of a (merged) STATS answer."""
    return {name: ModelInfo.from_stats(name, figures) for name, figures in stats.get("models", {}).items()}


class Catalog:
    """The models of the last STATS answer, refreshed as described in the module's docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._models: dict[str, ModelInfo] = {}
        self._taken_at = -math.inf
        self._refresh: asyncio.Task[None] | None = None

    def update(self, stats: Mapping[str, Any]) -> dict[str, ModelInfo]:
        """Take a fresh STATS answer (the model list handlers ask for one anyway); returns its models."""
        self._models = models_of(stats)
        self._taken_at = self._clock()
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

    def _start_refresh(self, client: AsyncClient) -> asyncio.Task[None]:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._fetch(client))
        return self._refresh

    async def _fetch(self, client: AsyncClient) -> None:
        try:
            self.update(merge_stats(await client.stats_by_broker(timeout_ms=STATS_TIMEOUT_MS)))
        except ZBatchError:
            self._taken_at = self._clock()  # no broker answered: keep what is known, ask again later

    async def close(self) -> None:
        """Cancel a refresh in flight (the application is shutting down)."""
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh


async def fleet_stats(request: web.Request) -> dict[str, Any]:
    """Every broker's statistics in one view (zbatch/client/stats.py), which also refreshes the catalog.

    Raises the error of the first broker if none answers.
    """
    stats = merge_stats(await request.app[CLIENT].stats_by_broker())
    request.app[CATALOG].update(stats)
    return stats


def readiness(stats: Mapping[str, Any] | Exception, required: tuple[str, ...]) -> str:
    """``ready``, or why one broker is not: it does not answer, it drains, or a required model has no worker."""
    if isinstance(stats, Exception):
        return f"not answering ({stats})"
    if stats.get("draining"):
        return "draining"
    missing = [m for m in required if worker_count(stats, m) < 1]
    return f"no worker serves {', '.join(missing)}" if missing else "ready"


def worker_count(stats: Mapping[str, Any], model: str) -> int:
    """How many workers the broker has for ``model`` (0 for a model it does not know)."""
    return int(stats.get("models", {}).get(model, {}).get("workers", 0))
