"""What the brokers say of each model (its task and READY's details, from STATS), kept briefly.

A sender that needs a model's details on its hot path (the gateway's
dialects; a client or a gateway that tokenizes for the model) cannot ask the
brokers on every request: :class:`ModelCatalog` keeps the last answer.  A
known model is looked up in a dict, and once the answer is older than
:data:`FRESH_S` one refresh starts in the background while requests go on
with what is known.  Only a model not in the catalog waits for a refresh (for
at most :data:`MISS_WAIT_S`), at most one every :data:`RETRY_S`, so a flood of
requests for unknown names costs the brokers one STATS per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from zbatch.client.errors import ZBatchError
from zbatch.client.stats import merge_stats

FRESH_S = 2.0  # a catalog older than this is refreshed in the background
RETRY_S = 0.5  # an unknown model waits for a refresh at most this often
MISS_WAIT_S = 0.25  # and for at most this long: a hung broker must not hold requests up
STATS_TIMEOUT_MS = 1000


class StatsSource(Protocol):
    """What the catalog asks: every broker's STATS answer, or the error it gave (:class:`zbatch.AsyncClient`)."""

    async def stats_by_broker(self, *, timeout_ms: int = ...) -> Mapping[str, Mapping[str, Any] | Exception]: ...


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
    tokenizer: str | None = None  # the fingerprint of the tokenizer a sender may tokenize with (tokenizing.py)
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


class ModelCatalog:
    """The models of the last STATS answer, refreshed as described in the module's docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._models: dict[str, ModelInfo] = {}
        self._taken_at = -math.inf
        self._failure: ZBatchError | None = None  # why the last refresh got no answer, if it did not
        self._refresh: asyncio.Future[None] | None = None
        self._closed = False

    def update(self, stats: Mapping[str, Any]) -> dict[str, ModelInfo]:
        """Take a fresh STATS answer (the model list handlers ask for one anyway); returns its models."""
        self._models = models_of(stats)
        self._taken_at = self._clock()
        self._failure = None
        return self._models

    async def lookup(self, client: StatsSource, model: str) -> ModelInfo | None:
        """``model``'s info: at once if known; else after a refresh, unless one ran within RETRY_S."""
        info = self._models.get(model)
        if info is not None:
            if self.age > FRESH_S:
                self.start_refresh(client)
            return info
        if self.age > RETRY_S:
            await self.wait_for_refresh(client)
            return self._models.get(model)
        return None

    def known(self, client: StatsSource, model: str) -> ModelInfo | None:
        """``model``'s info if known, never waiting (a stale catalog starts its refresh, as :meth:`lookup` does)."""
        if self.age > FRESH_S:
            self.start_refresh(client)
        return self._models.get(model)

    @property
    def age(self) -> float:
        """Seconds since the last answer, or since the last refresh that got none."""
        return self._clock() - self._taken_at

    async def wait_for_refresh(self, client: StatsSource, wait_s: float | None = MISS_WAIT_S) -> None:
        """Start a refresh, or join the one under way, and wait for it at most ``wait_s`` (None: until it ends, which
        the brokers' STATS timeouts bound)."""
        refresh = self.start_refresh(client)
        try:
            await asyncio.wait_for(asyncio.shield(refresh), wait_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if not refresh.cancelled():
                raise  # the caller's own cancellation, not the refresh's (closed meanwhile)

    def start_refresh(self, client: StatsSource) -> asyncio.Future[None]:
        """One refresh in the background: the one under way, if any (once closed, none: a finished future)."""
        if self._refresh is None or self._refresh.done() or self._refresh.get_loop() is not asyncio.get_running_loop():
            if self._closed:
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done
            self._refresh = asyncio.get_running_loop().create_task(self._fetch(client))
        return self._refresh

    async def _fetch(self, client: StatsSource) -> None:
        try:
            self.update(merge_stats(await client.stats_by_broker(timeout_ms=STATS_TIMEOUT_MS)))
        except ZBatchError as exc:
            self._taken_at = self._clock()  # no broker answered: keep what is known, ask again later
            self._failure = exc

    async def close(self) -> None:
        """Cancel a refresh in flight, and start none from now on (the owner is shutting down)."""
        self._closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
