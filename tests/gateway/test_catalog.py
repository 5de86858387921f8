"""The model catalog: known models answered from memory, refreshed in the background, unknown ones rate-limited."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.catalog import Catalog
from zbatch.client import AsyncClient, BrokerUnavailable
from zbatch.client.catalog import FRESH_S, RETRY_S, ModelInfo


class Brokers:
    """Counts STATS questions; answers with ``models`` (or fails while ``down``)."""

    def __init__(self) -> None:
        self.asked = 0
        self.down = False
        self.models: dict[str, Any] = {"m": {"workers": 1, "info": {"task": "rerank", "max_length": 128,
                                                                    "labels": ["LABEL_0"]}}}

    async def stats_by_broker(self, **options: Any) -> dict[str, Any]:
        self.asked += 1
        if self.down:
            return {"tcp://b:1": BrokerUnavailable("down")}
        workers = [{"identity": "01", "models": list(self.models)}]
        return {"tcp://b:1": {"models": self.models, "workers": workers}}


def test_known_models_are_answered_from_memory_and_refreshed_in_the_background() -> None:
    now = [0.0]
    brokers = Brokers()
    catalog = Catalog(clock=lambda: now[0])
    client = cast(AsyncClient, brokers)

    async def scenario() -> None:
        first = await catalog.lookup(client, "m")
        assert first == ModelInfo("m", 1, "rerank", None, 128, None, None, ("LABEL_0",))
        assert brokers.asked == 1
        assert await catalog.lookup(client, "m") is first and brokers.asked == 1
        now[0] += FRESH_S + 0.1
        brokers.models["m"]["info"]["task"] = "embeddings"
        stale = await catalog.lookup(client, "m")
        assert stale is not None and stale.task == "rerank"  # the stale answer, at once
        await asyncio.sleep(0)
        fresh = await catalog.lookup(client, "m")
        assert brokers.asked == 2 and fresh is not None and fresh.task == "embeddings"
        await catalog.close()

    asyncio.run(scenario())


def test_unknown_models_ask_the_brokers_at_most_once_per_interval_and_survive_a_broker_down() -> None:
    now = [10.0]
    brokers = Brokers()
    catalog = Catalog(clock=lambda: now[0])
    client = cast(AsyncClient, brokers)

    async def scenario() -> None:
        assert await catalog.lookup(client, "nope") is None and brokers.asked == 1
        for _ in range(50):
            assert await catalog.lookup(client, "nope") is None
        assert brokers.asked == 1
        now[0] += RETRY_S + 0.1
        brokers.down = True
        assert await catalog.lookup(client, "nope") is None and brokers.asked == 2
        assert (await catalog.lookup(client, "m")) is not None  # what was known is kept
        await catalog.close()

    asyncio.run(scenario())
