"""Hostile payloads from a direct ZeroMQ client against a real worker: its memory, its answers, its heartbeats.

Usage: python -m scripts.benchmarks.studies.hostile_payloads [--attacks empty-arrays,...] [--root DIR]

Each attack starts a fresh broker and one worker with the default model and
default settings, keeps normal traffic flowing through the broker (four
closed-loop clients), and sends the payload of ``tests/worker/test_hostile_payloads.py``
as one REQUEST.  It prints, per attack, the worker's RSS before and at its
peak, the hostile request's answer (or ``no answer`` after the timeout) and
how long it took, whether the broker lost the worker meanwhile, whether the
worker still answers a normal request afterwards, and the normal traffic.
``--root`` runs the daemons of another checkout, for before/after tables.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.studies.hostile import run_cli
from tests.hostile import NormalTraffic, PeakRss, rss_bytes
from tests.worker.test_hostile_payloads import EMPTY_ARRAYS, HUGE_TEXT, MIXED_KEYS
from worker.runners import DEFAULT_MODEL_NAME
from zbatch import testing
from zbatch.client import AsyncClient, ZBatchError

MIB = 1 << 20
TIMEOUT_MS = 30_000
PAYLOADS = {"empty-arrays": (EMPTY_ARRAYS, 1), "huge-text": (HUGE_TEXT, 1), "mixed-keys": (MIXED_KEYS, 1)}


async def send(frontend: str, payload: bytes, items: int) -> tuple[str, float]:
    """One hostile REQUEST; its answer's status and message (or why there was none) and the seconds it took."""
    started = time.perf_counter()
    async with AsyncClient(frontend, fail_fast_overload=False, timeout_ms=TIMEOUT_MS) as client:
        try:
            reply = await client.request(DEFAULT_MODEL_NAME, payload, items=items)
        except ZBatchError as exc:
            return f"no answer ({type(exc).__name__})", time.perf_counter() - started
    return f"{reply.status.name}: {reply.message[:80]}", time.perf_counter() - started


def normal_answer(frontend: str) -> str:
    async def go() -> str:
        async with AsyncClient(frontend, timeout_ms=10_000) as client:
            try:
                await client.infer(DEFAULT_MODEL_NAME, ["a normal request after the hostile one"])
            except ZBatchError as exc:
                return f"failed ({type(exc).__name__})"
        return "answered"

    return asyncio.run(go())


def measure(name: str) -> dict[str, Any]:
    payload, items = PAYLOADS[name]
    with testing.Daemons(Path(tempfile.mkdtemp(prefix=f"zbatch-hostile-{name}-"))) as daemons:
        broker = daemons.add(testing.start_broker(daemons.log_dir))
        worker = daemons.add(testing.start_worker(broker, daemons.log_dir, "w0"))
        pid = worker.process.pid
        before = rss_bytes(pid)
        with NormalTraffic(broker.frontend, DEFAULT_MODEL_NAME) as traffic, PeakRss(pid) as peak:
            answer, seconds = asyncio.run(send(broker.frontend, payload, items))
            traffic.stop()
        workers = (testing.broker_stats(broker.frontend) or {}).get("workers", [])
        return {"attack": name, "rss_before_mib": round(before / MIB), "rss_peak_mib": round(peak.peak / MIB),
                "answer": answer, "answer_s": round(seconds, 2), "worker_alive": worker.alive(),
                "worker_listed": any(w.get("name") == "w0" for w in workers),
                "normal_after": normal_answer(broker.frontend), "normal_traffic": traffic.summary()}


def main() -> None:
    run_cli(__doc__, list(PAYLOADS), measure)


if __name__ == "__main__":
    main()
