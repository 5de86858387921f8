"""What the worker's model ran during a measurement, from its Prometheus page: batch sizes and time per batch.

The bench scrapes the worker's ``/metrics`` before and after each
measurement and subtracts, so the worker runs as deployed (no debug log
line per request or batch, which cost it time here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SIZES = "zbatch_worker_batch_size_items"
TIMES = "zbatch_worker_inference_duration_seconds"


@dataclass
class Snapshot:
    """Cumulative bucket counts of the batch-size histogram, and the sums and counts of both histograms."""

    buckets: dict[float, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)


async def snapshots(metrics_urls: list[str]) -> Snapshot:
    """Several workers' histograms added up, as if one worker had run all their batches."""
    total = Snapshot()
    for url in metrics_urls:
        each = await snapshot(url)
        for bound, count in each.buckets.items():
            total.buckets[bound] = total.buckets.get(bound, 0) + count
        for name, value in each.sums.items():
            total.sums[name] = total.sums.get(name, 0) + value
    return total


async def snapshot(metrics_url: str) -> Snapshot:
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as response:
        text = await response.text()
    taken = Snapshot()
    for family in text_string_to_metric_families(text):
        if family.name not in (SIZES, TIMES):
            continue
        for sample in family.samples:
            if sample.name == f"{SIZES}_bucket":
                taken.buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith(("_sum", "_count")):
                taken.sums[sample.name] = sample.value
    return taken


def _label(low: float, high: float) -> str:
    if high == float("inf"):
        return f">{low:g}"
    return f"{high:g}" if high - low <= 1 else f"{low + 1:g}-{high:g}"


def difference(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Batches run between two snapshots: count, mean size, mean model time, and sizes by bucket."""
    batches = after.sums.get(f"{SIZES}_count", 0) - before.sums.get(f"{SIZES}_count", 0)
    if batches <= 0:
        return {}
    items = after.sums.get(f"{SIZES}_sum", 0) - before.sums.get(f"{SIZES}_sum", 0)
    seconds = after.sums.get(f"{TIMES}_sum", 0) - before.sums.get(f"{TIMES}_sum", 0)
    histogram: dict[str, int] = {}
    low, below = 0.0, 0.0
    for bound in sorted(after.buckets):
        cumulative = after.buckets[bound] - before.buckets.get(bound, 0)
        if cumulative > below:
            histogram[_label(low, bound)] = int(cumulative - below)
        low, below = bound, cumulative
    return {"batches": int(batches), "mean_size": items / batches, "mean_batch_ms": seconds / batches * 1000,
            "histogram": histogram}


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several measurements' batches as one (the rounds of one point)."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    batches = sum(p["batches"] for p in parts)
    histogram: dict[str, int] = {}
    for part in parts:
        for label, count in part["histogram"].items():
            histogram[label] = histogram.get(label, 0) + count
    return {"batches": batches,
            "mean_size": sum(p["mean_size"] * p["batches"] for p in parts) / batches,
            "mean_batch_ms": sum(p["mean_batch_ms"] * p["batches"] for p in parts) / batches,
            "histogram": dict(sorted(histogram.items(), key=lambda kv: _order(kv[0])))}


def _order(label: str) -> float:
    return float(label.lstrip(">").split("-")[0]) + (0.5 if label.startswith(">") else 0)
