"""Priorities under overload, end to end: low requests are refused while high ones still get in."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemons import broker_stats, running_stack, wait_until
from worker.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME


def test_high_priority_is_admitted_while_low_is_refused(log_dir: Path) -> None:
    broker = {"max_backlog": 8, "priority_reserve": 0.25}
    worker = {"capacity": 1, "max_batch_size": 1}
    with running_stack(log_dir, workers=1, broker=broker, worker=worker) as stack:
        url = f"{stack['gateway'].url}/models/{MODEL}"

        def backlog() -> int:
            stats = broker_stats(stack["broker"].frontend) or {"models": {}}
            return int(stats["models"].get(MODEL, {}).get("backlog_items", 0))

        async def scenario() -> tuple[list[int], list[int], int]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                async def post(priority: str, i: int) -> int:
                    body = {"inputs": f"priority {priority} request {i} " * 20}
                    async with session.post(url, json=body, headers={"X-Priority": priority}) as r:
                        await r.read()
                        return r.status

                flood = [asyncio.create_task(post("low", i)) for i in range(30)]
                await asyncio.to_thread(wait_until, lambda: backlog() >= 6, 30, "low requests to fill their share")
                late_low = await post("low", 99)
                high = await asyncio.gather(*(post("high", i) for i in range(3)))
                return list(await asyncio.gather(*flood)), list(high), late_low

        flood, high, late_low = asyncio.run(scenario())
    statuses: dict[str, Any] = {"flood": sorted(set(flood)), "high": high, "late_low": late_low}
    print(f"\nFIGURES priority: {statuses}")
    assert high == [200, 200, 200]
    assert late_low == 503 and 503 in flood and 200 in flood
    assert set(flood) <= {200, 503}
