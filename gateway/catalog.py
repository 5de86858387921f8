"""What the gateway knows of each model (:class:`zbatch.client.catalog.ModelCatalog`), and its default model.

The dialects need a model's task (to refuse a route it cannot answer, to
read a JSON string as text or as a base64 image) and its details (TEI's
``/info``, KServe's metadata, OpenAI's model list): the catalog keeps the
brokers' last STATS answer, refreshed in the background.

It also gives the default model of a gateway whose settings name none
(``default_model``, else the first of ``models``): the one model a worker
serves (:func:`followed_default`), so that ``POST /``, TEI's routes and
``/readyz`` follow the model the workers were started with, wherever it was
set.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from gateway.appkeys import CLIENT
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from zbatch.client import AsyncClient
from zbatch.client.catalog import FRESH_S, RETRY_S, ModelCatalog, ModelInfo, models_of
from zbatch.client.stats import merge_stats
from zbatch.client.tokenizing import Tokenizers
from zbatch.protocol.vocabulary import EMBEDDINGS

__all__ = ["CATALOG", "FRESH_S", "RETRY_S", "Catalog", "ModelInfo", "default_model", "fleet_stats", "followed_config",
           "followed_default", "models_of", "readiness", "served_models", "worker_count"]


class Catalog(ModelCatalog):
    """The brokers' models as :class:`ModelCatalog` keeps them, the tokenizers fetched for them, the default model."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.tokenizers = Tokenizers(clock)

    async def default_model(self, client: AsyncClient) -> str:
        """The model a request that names none goes to where the settings name no default: the one model a worker
        serves (:func:`followed_default`).  Known models answer at once; with none known, a refresh is awaited
        as for an unknown model."""
        if not served_models(self._models) and self.age > RETRY_S:
            await self.wait_for_refresh(client)
        elif self.age > FRESH_S:
            self.start_refresh(client)
        if self._failure is not None and not served_models(self._models):
            raise self._failure  # no broker answers: that, rather than "no worker"
        return followed_default(self._models)

    async def close(self) -> None:
        """Cancel a refresh and tokenizer fetches in flight (the application is shutting down)."""
        await super().close()
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
