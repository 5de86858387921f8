"""One view of several brokers' statistics (PROTOCOL.md 3.6 and 6.6), for the gateway and ``zbatch-status``.

Each broker's STATS answer is kept whole under ``brokers`` (by endpoint; a
broker that did not answer has ``{"error": message}`` there), and merged at
the top level into the shape of one broker's answer, so a reader of one
broker reads a fleet the same way:

* what each broker holds on its own adds up: backlogs, free credit, requests
  by status, worker removals;
* a worker registered with several brokers is listed once, by its routing id,
  with the brokers it is registered with (``brokers``); its capacity, credit
  and work in flight add up over them, and a model's ``workers`` counts
  distinct workers;
* batch counts come from the workers, which tell every broker the same
  totals: the merged figure is the largest any broker has, not the sum;
* ``draining`` is true when every broker that answered is draining.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

ADDED = ("backlog_items", "backlog_bytes", "free_credit")  # per model: each broker's own
FROM_WORKERS = ("batches", "batched_items", "cancelled_items", "expired_items")  # per model: the same everywhere
WORKER_ADDED = ("capacity", "free_credit", "in_flight", "in_flight_items", "declined")


def merge_stats(by_broker: Mapping[str, Mapping[str, Any] | Exception]) -> dict[str, Any]:
    """The fleet's statistics from each broker's (or the error it gave); raises the first error if none answered.

    A figure a broker left out counts as zero (an older broker, or a stand-in in a test).
    """
    answered = {endpoint: stats for endpoint, stats in by_broker.items() if not isinstance(stats, Exception)}
    if not answered:
        raise next(error for error in by_broker.values() if isinstance(error, Exception))
    first = next(iter(answered.values()))
    workers = merge_workers(answered)
    return {
        "uptime_s": max(stats.get("uptime_s", 0.0) for stats in answered.values()),
        "draining": all(stats.get("draining", False) for stats in answered.values()),
        "limits": first.get("limits", {}),
        "worker_removals": dict(sum((Counter(s.get("worker_removals", {})) for s in answered.values()), Counter())),
        "models": merge_models(answered, workers),
        "workers": workers,
        "brokers": {endpoint: {"error": str(stats)} if isinstance(stats, Exception) else dict(stats)
                    for endpoint, stats in by_broker.items()},
    }


def merge_models(answered: Mapping[str, Mapping[str, Any]], workers: list[dict[str, Any]]) -> dict[str, Any]:
    models: dict[str, dict[str, Any]] = {}
    for stats in answered.values():
        for name, figures in stats.get("models", {}).items():
            merged = models.setdefault(name, dict(figures) | dict.fromkeys(ADDED + FROM_WORKERS, 0)
                                       | {"requests": {}})
            for key in ADDED:
                merged[key] += figures.get(key, 0)
            for key in FROM_WORKERS:
                merged[key] = max(merged[key], figures.get(key, 0))
            merged["requests"] = dict(Counter(merged["requests"]) + Counter(figures.get("requests", {})))
    for name, merged in models.items():
        merged["workers"] = sum(1 for worker in workers if name in worker.get("models", ()))
        merged["mean_batch_size"] = round(merged["batched_items"] / merged["batches"], 3) if merged["batches"] else 0.0
    return models


def merge_workers(answered: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per worker (routing id), in the order first seen, with the brokers it is registered with."""
    merged: dict[str, dict[str, Any]] = {}
    for endpoint, stats in answered.items():
        for worker in stats.get("workers", []):
            entry = merged.get(worker["identity"])
            if entry is None:
                merged[worker["identity"]] = dict(worker) | {"brokers": [endpoint]}
                continue
            entry["brokers"].append(endpoint)
            for key in WORKER_ADDED:
                entry[key] = entry.get(key, 0) + worker.get(key, 0)
            entry["last_seen_s"] = min(entry.get("last_seen_s", 0.0), worker.get("last_seen_s", 0.0))
            entry["draining"] = entry.get("draining", False) or worker.get("draining", False)
            if _batched(worker) > _batched(entry):
                entry["batches"] = worker["batches"]  # the later report of the same cumulative counts
    return list(merged.values())


def _batched(worker: Mapping[str, Any]) -> int:
    return sum(int(counts.get("items", 0)) for counts in worker.get("batches", {}).values())
