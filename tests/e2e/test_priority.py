"""Priorities under overload, end to end: low requests are refused while high ones still get in.

The one worker is paused (SIGSTOP, a real hung process) while the backlog is
filled, so the backlog stays exactly where the admissions put it: a worker
that keeps draining it would make the check a race against the model's speed.
Heartbeats are slow enough that the broker does not give the paused worker up.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemons import broker_stats, running_stack, wait_until
from worker.runners import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
HEARTBEAT = {"heartbeat_ms": 2000, "heartbeat_liveness": 10}  # a pause of 20 s is not a death


def test_high_priority_is_admitted_while_low_is_refused(log_dir: Path) -> None:
    broker = {"max_backlog": 8, "priority_reserve": 0.25} | HEARTBEAT  # low: 6 items, high: 10
    worker = {"capacity": 1, "max_batch_size": 1} | HEARTBEAT
    with running_stack(log_dir, workers=1, broker=broker, worker=worker) as stack:
        url = f"{stack['gateway'].url}/models/{MODEL}"

        def backlog() -> int:
            stats = broker_stats(stack["broker"].frontend) or {"models": {}}
            return int(stats["models"].get(MODEL, {}).get("backlog_items", 0))

        async def scenario() -> tuple[list[int], list[int], int]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                async def post(priority: str, i: int) -> int:
                    body = {"inputs": f"priority {priority} request {i}"}
                    async with session.post(url, json=body, headers={"X-Priority": priority}) as r:
                        await r.read()
                        return r.status

                stack["w1"].signal(signal.SIGSTOP)
                try:
                    flood = [asyncio.create_task(post("low", i)) for i in range(30)]
                    # One low request is on the paused worker, 6 fill low's share, the other 23 are refused.
                    await asyncio.to_thread(wait_until, lambda: sum(t.done() for t in flood) == 23 and backlog() == 6,
                                            30, "low requests to fill their share and the rest to be refused")
                    late_low = await post("low", 99)
                    high = [asyncio.create_task(post("high", i)) for i in range(3)]
                    await asyncio.to_thread(wait_until, lambda: backlog() == 9, 30, "the high requests to be admitted")
                finally:
                    stack["w1"].signal(signal.SIGCONT)
                return list(await asyncio.gather(*flood)), list(await asyncio.gather(*high)), late_low

        flood, high, late_low = asyncio.run(scenario())
    statuses: dict[str, Any] = {"flood": sorted(set(flood)), "high": high, "late_low": late_low}
    print(f"\nFIGURES priority: {statuses}")
    assert high == [200, 200, 200]
    assert late_low == 503
    assert sorted(flood).count(503) == 23 and flood.count(200) == 7
