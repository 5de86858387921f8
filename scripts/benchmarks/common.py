"""What every case shares: the run's settings, the result rows, and the zbatch stack reused by several cases.

Starting broker + worker + gateway costs a model load, so the cases that
measure the same real stack (zbatch-http, zbatch-zmq, overload, storm) share one;
the runner stops it as soon as no remaining case needs it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.benchmarks import procs
from scripts.benchmarks.procs import MODEL, Procs

BATCH_LINE = re.compile(rb"batch of (\d+) items in ([\d.]+) ms")
IDLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Settings:
    quick: bool
    warmup_s: float
    duration_s: float
    concurrency: tuple[int, ...]  # zbatch and the baselines
    side_concurrency: tuple[int, ...]  # routing and gateway
    overload_s: float
    overload_grace_s: float
    scale_workers: tuple[int, ...]
    scale_per_worker: int  # closed-loop clients per simulated worker: two full batches in flight each

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(True, 1.0, 2.5, (1, 32), (1, 32), 3.0, 6.0, (1, 8), 64)
        return cls(False, 2.0, 10.0, (1, 8, 32, 128), (1, 32, 128), 20.0, 15.0, (1, 2, 4, 8), 64)


def row(case: str, system: str, concurrency: int | str, result: dict[str, Any], **detail: Any) -> dict[str, Any]:
    """One line of the results table; the raw measurement stays under ``detail``."""
    return {
        "case": case, "system": system, "concurrency": concurrency,
        "req_s": result.get("req_s"), "texts_s": result.get("texts_s"),
        "p50_ms": result.get("p50_ms"), "p99_ms": result.get("p99_ms"),
        "errors": result.get("errors", 0), "ratio": "", "other_cores": result.get("other_cores"),
        "detail": result | detail,
    }


@dataclass
class ZbatchStack:
    """Broker, ONE real worker (2 torch threads) and the gateway, as deployed."""

    procs: Procs
    frontend: str
    url: str
    worker_log: Path

    def log_offset(self) -> int:
        return self.worker_log.stat().st_size

    async def wait_idle(self) -> None:
        """Until the broker holds no work: a storm's cancelled leftovers must not run into the next measurement."""
        async def idle() -> bool:
            stats = await procs.broker_stats(self.frontend)
            if stats is None:
                return False
            backlog = sum(m["backlog_items"] for m in stats["models"].values())
            return backlog == 0 and all(w["in_flight"] == 0 for w in stats["workers"])

        await self.procs.wait(idle, "the zbatch stack to finish its leftover work", IDLE_TIMEOUT_S)

    def batch_sizes(self, since: int) -> dict[str, Any]:
        """Batch sizes (and model time per batch) the worker logged since ``since``."""
        with self.worker_log.open("rb") as f:
            f.seek(since)
            matches = [(int(m[1]), float(m[2])) for m in BATCH_LINE.finditer(f.read())]
        if not matches:
            return {}
        sizes = Counter(size for size, _ in matches)
        return {"batches": len(matches), "mean_size": sum(s for s, _ in matches) / len(matches),
                "mean_batch_ms": sum(ms for _, ms in matches) / len(matches),
                "histogram": {str(k): v for k, v in sorted(sizes.items())}}


@dataclass
class Context:
    settings: Settings
    rows: list[dict[str, Any]] = field(default_factory=list)
    capacities: dict[str, float] = field(default_factory=dict)  # measured for overload/storm, by case
    _stack: ZbatchStack | None = None

    def find(self, case: str, system: str | None = None, concurrency: int | str | None = None) -> dict[str, Any] | None:
        for r in self.rows:
            if r["case"] == case and system in (None, r["system"]) and concurrency in (None, r["concurrency"]):
                return r
        return None

    async def zbatch(self) -> ZbatchStack:
        if self._stack is None:
            p = Procs()
            try:
                procs.log("starting the zbatch stack: broker, 1 worker (2 torch threads), gateway")
                frontend, backend = await procs.start_broker(p)
                worker = await procs.start_model_worker(p, frontend, backend)
                url = await procs.start_gateway(p, frontend)
            except BaseException:
                p.close()
                raise
            self._stack = ZbatchStack(p, frontend, f"{url}/models/{MODEL}", worker.log_path)
        return self._stack

    def close_zbatch(self) -> None:
        if self._stack is not None:
            procs.log("stopping the zbatch stack")
            self._stack.procs.close()
            self._stack = None
