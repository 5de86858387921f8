"""Prometheus metrics of a worker, built from its model slots' counters when Prometheus scrapes.

The I/O loop records each batch's size and inference time in plain
histograms (:mod:`zbatch.runtime.histogram`) on the model's slot;
:func:`broker.metrics.start_metrics` serves these families from a thread but
builds them on the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from worker.slots import ModelSlot
from zbatch.protocol.wire import Status
from zbatch.runtime.metrics import histogram_family


def worker_families(slots: Mapping[str, ModelSlot]) -> list[Metric]:
    def counter(name: str, documentation: str, value: Callable[[ModelSlot], int]) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=["model"])
        for model, slot in slots.items():
            family.add_metric([model], value(slot))
        return family

    window = GaugeMetricFamily("zbatch_worker_batch_window_seconds",
                               "Longest wait for more items: the batch delay, or the model's fixed cost per batch "
                               "if shorter", labels=["model"])
    for model, slot in slots.items():
        window.add_metric([model], slot.policy.window_s)
    return [
        window,
        histogram_family("zbatch_worker_batch_size_items", "Items per batch run by the model",
                         ["model"], (([m], slot.batch_sizes) for m, slot in slots.items())),
        histogram_family("zbatch_worker_inference_duration_seconds", "Time the model took per batch",
                         ["model"], (([m], slot.inference_times) for m, slot in slots.items())),
        counter("zbatch_worker_batches_total", "Batches run by the model", lambda s: s.batches),
        counter("zbatch_worker_items_total", "Items run by the model", lambda s: s.batched_items),
        counter("zbatch_worker_items_expired_total", "Items dropped because their deadline passed before they ran",
                lambda s: s.assembler.skipped_items[Status.DEADLINE_EXCEEDED]),
        counter("zbatch_worker_items_cancelled_total", "Items skipped because the broker cancelled their request",
                lambda s: s.assembler.skipped_items[Status.CANCELLED]),
    ]
