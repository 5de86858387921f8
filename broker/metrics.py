"""Prometheus metrics of the broker, read from the core's state when Prometheus scrapes.

The core keeps plain counters and :class:`~zbatch.runtime.histogram.Histogram` s;
the families are built only at scrape time, so routing pays nothing for metrics.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from broker.core import BrokerCore
from zbatch.protocol.wire import Status
from zbatch.runtime.metrics import histogram_family

# Every reason is always exported (zero until it happens), so alerts can use rate() from the start.
REJECTION_REASONS = tuple(s.value for s in Status if s not in (Status.OK, Status.CANCELLED))
REMOVAL_REASONS = ("silent", "disconnected", "unreachable", "restarted", "reconnected", "overdue")


def broker_families(core: BrokerCore) -> list[Metric]:
    """The broker's metrics, read from the core's state at scrape time."""
    backlog = GaugeMetricFamily("zbatch_broker_backlog_items", "Items waiting for a worker", labels=["model"])
    workers = GaugeMetricFamily("zbatch_broker_workers", "Workers alive serving the model", labels=["model"])
    credit = GaugeMetricFamily("zbatch_broker_free_credit_items",
                               "Items the model's workers can still take", labels=["model"])
    rate = GaugeMetricFamily("zbatch_broker_service_rate_items_per_second",
                             "Items per second the model's workers run, measured from their batch times; what "
                             "admission predicts waits from (absent until a worker's rate is established)",
                             labels=["model"])
    dispatches = CounterMetricFamily("zbatch_broker_dispatches_total", "Requests sent to a worker",
                                     labels=["model"])
    answers = CounterMetricFamily("zbatch_broker_answers_total", "Requests answered, by status",
                                  labels=["model", "status"])
    for name, model in core.models.items():
        backlog.add_metric([name], model.backlog_items)
        workers.add_metric([name], len(model.workers))
        credit.add_metric([name], sum(max(0, w.free_credit) for w in model.workers.values()))
        if model.rate is not None:
            rate.add_metric([name], model.rate)
        dispatches.add_metric([name], model.dispatched)
        for status, count in model.answered.items():
            answers.add_metric([name, status.value], count)
    queue_time = histogram_family("zbatch_broker_queue_duration_seconds", "Time from admission to dispatch",
                                  ["model"], (([name], m.queue_time) for name, m in core.models.items()))
    rejections = CounterMetricFamily("zbatch_broker_rejections_total",
                                     "Requests the broker answered itself with an error", labels=["reason"])
    for reason in REJECTION_REASONS:
        rejections.add_metric([reason], core.rejections[Status(reason)])
    removals = CounterMetricFamily("zbatch_broker_worker_removals_total", "Workers removed, by reason",
                                   labels=["reason"])
    for reason in REMOVAL_REASONS:
        removals.add_metric([reason], core.removals[reason])
    expiries = CounterMetricFamily("zbatch_broker_heartbeat_expiries_total",
                                   "Workers declared dead after missing heartbeats",
                                   value=core.removals["silent"])
    return [backlog, workers, credit, rate, dispatches, answers, queue_time, rejections, removals, expiries]
