"""The STATS payload (PROTOCOL.md section 3.6), built from the core's records."""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.limits import ModelLimits
from broker.state import ModelState, WorkerState
from zbatch.protocol.wire import NORMAL_PRIORITY


def model_stats(model: ModelState, now: float) -> dict[str, Any]:
    totals = model.batch_totals()
    rate = model.rate
    wait_s = model.predicted_wait_s(NORMAL_PRIORITY, 1, now)
    return {
        "backlog_items": model.backlog_items,
        "in_flight_items": model.in_flight_items,
        "service_rate": None if rate is None else round(rate, 3),
        "predicted_wait_ms": None if wait_s is None else round(wait_s * 1000),
        "lateness_ms": round(model.lateness.now(now) * 1000),
        "backlog_bytes": model.backlog_bytes,
        "held_bytes": model.held_bytes,
        "workers": len(model.workers),
        "free_credit": sum(max(0, w.free_credit) for w in model.workers.values()),
        "requests": {status.value: count for status, count in model.answered.items()},
        "batches": totals.batches,
        "batched_items": totals.items,
        "mean_batch_size": round(totals.items / totals.batches, 3) if totals.batches else 0.0,
        "cancelled_items": totals.cancelled,
        "expired_items": totals.expired,
        "info": model_info(model),
    }


def model_info(model: ModelState) -> dict[str, Any]:
    """What the newest worker serving the model announced about it (PROTOCOL.md 3.4); {} with no worker."""
    for worker in reversed(model.workers.values()):
        for info in worker.ready.models:
            if info.name == model.name:
                return info.details()
    return {}


def worker_stats(worker: WorkerState, now: float) -> dict[str, Any]:
    ready = worker.ready
    return {
        "identity": worker.identity.hex(),
        "name": ready.name,
        "host": ready.host,
        "pid": ready.pid,
        "device": ready.device,
        "models": worker.models,
        "capacity": worker.capacity,
        "free_credit": worker.free_credit,
        "in_flight": len(worker.in_flight),
        "in_flight_items": worker.in_flight_items,
        "draining": worker.draining,
        "declined": worker.declined,
        "last_seen_s": round(now - worker.last_seen, 3),
        "batches": {name: dataclasses.asdict(c) for name, c in worker.batches.items()},
    }


def limits_stats(limits: ModelLimits, max_message_bytes: int) -> dict[str, int]:
    """What a client needs to know to stay within the broker's limits."""
    return {"timeout_ms": limits.timeout_ms, "max_timeout_ms": limits.max_timeout_ms,
            "max_queue_ms": limits.max_queue_ms, "cold_backlog": limits.cold_backlog,
            "max_backlog": limits.max_backlog, "max_backlog_bytes": limits.max_backlog_bytes,
            "max_message_bytes": max_message_bytes}
