"""zbatch/client/catalog.py's ModelCatalog where a client outlives its event loop (a new loop gets a new refresh),
with a FAKE stats source; the refresh rules themselves are tested through the gateway's catalog
(tests/gateway/test_catalog.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from zbatch.client.catalog import ModelCatalog

STATS = {"tcp://b:1": {"models": {"m": {"workers": 1, "info": {"tokenizer": "0123456789abcdef"}}}}}


class FakeBrokers:
    """Answers STATS at once, or never while ``hung``."""

    def __init__(self) -> None:
        self.hung = False

    async def stats_by_broker(self, *, timeout_ms: int = 1000) -> Mapping[str, Mapping[str, Any] | Exception]:
        if self.hung:
            await asyncio.Event().wait()
        return STATS


def test_a_refresh_left_pending_by_a_closed_loop_does_not_stop_the_next_loops() -> None:
    brokers, catalog = FakeBrokers(), ModelCatalog()
    brokers.hung = True
    first = asyncio.new_event_loop()

    async def start() -> None:
        catalog.start_refresh(brokers)

    first.run_until_complete(start())
    first.close()  # its refresh never ends, and is never cancelled
    brokers.hung = False

    async def again() -> Any:
        await catalog.wait_for_refresh(brokers, None)
        return catalog.known(brokers, "m")

    info = asyncio.run(again())
    assert info is not None and info.tokenizer == "0123456789abcdef"
