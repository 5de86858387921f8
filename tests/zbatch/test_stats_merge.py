"""Several brokers' statistics in one view (zbatch/client/stats.py)."""

from __future__ import annotations

from typing import Any

import pytest

from zbatch.client import BrokerUnavailable
from zbatch.client.stats import merge_stats


def broker(requests: int, workers: list[dict[str, Any]], batches: int = 4, backlog: int = 1) -> dict[str, Any]:
    return {
        "uptime_s": 10.0, "draining": False, "limits": {"timeout_ms": 30_000},
        "worker_removals": {"silent": 1},
        "models": {"m": {"backlog_items": backlog, "backlog_bytes": 10, "workers": len(workers), "free_credit": 3,
                         "requests": {"ok": requests}, "batches": batches, "batched_items": 2 * batches,
                         "mean_batch_size": 2.0, "cancelled_items": 0, "expired_items": 0}},
        "workers": workers,
    }


def worker(identity: str, items: int) -> dict[str, Any]:
    return {"identity": identity, "name": identity, "models": ["m"], "capacity": 4, "free_credit": 3, "in_flight": 1,
            "in_flight_items": 1, "declined": 0, "draining": False, "last_seen_s": 0.5,
            "batches": {"m": {"batches": 1, "items": items, "cancelled": 0, "expired": 0}}}


def test_a_worker_of_both_brokers_counts_once_and_each_broker_stays_whole() -> None:
    a = broker(5, [worker("w1", 3), worker("w2", 1)])
    b = broker(7, [worker("w1", 4)], batches=6)
    merged = merge_stats({"tcp://a:1": a, "tcp://b:1": b})
    model = merged["models"]["m"]
    assert model["workers"] == 2 and model["requests"] == {"ok": 12} and model["backlog_items"] == 2
    assert model["batches"] == 6 and model["mean_batch_size"] == 2.0  # the workers' totals: the largest report
    [w1, w2] = merged["workers"]
    assert w1["brokers"] == ["tcp://a:1", "tcp://b:1"] and w1["capacity"] == 8 and w1["in_flight"] == 2
    assert w1["batches"]["m"]["items"] == 4 and w2["brokers"] == ["tcp://a:1"]
    assert merged["brokers"] == {"tcp://a:1": a, "tcp://b:1": b}
    assert merged["worker_removals"] == {"silent": 2}


def test_a_broker_that_did_not_answer_is_listed_with_its_error() -> None:
    a = broker(5, [worker("w1", 3)])
    merged = merge_stats({"tcp://a:1": a, "tcp://b:1": BrokerUnavailable("no answer")})
    assert merged["brokers"]["tcp://b:1"] == {"error": "no answer"}
    assert merged["models"]["m"]["requests"] == {"ok": 5}
    with pytest.raises(BrokerUnavailable, match="no answer"):
        merge_stats({"tcp://b:1": BrokerUnavailable("no answer")})


def test_one_broker_merged_is_that_broker_plus_where_its_workers_are() -> None:
    a = broker(5, [worker("w1", 3)])
    merged = merge_stats({"tcp://a:1": a})
    assert merged["models"] == a["models"]
    assert [dict(w, brokers=None) for w in merged["workers"]] == [dict(w, brokers=None) for w in a["workers"]]
