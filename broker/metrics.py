"""Prometheus metrics of the broker (and the helpers the worker shares).

The core keeps plain counters and :class:`broker.histogram.Histogram`\\ s; a
custom collector turns them into metric families only when Prometheus
scrapes, so routing pays nothing for metrics.  The scrape is served from
prometheus_client's HTTP thread, but the families are built on the daemon's
event loop (:class:`LoopCollector`), so they read a consistent state without
locks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from broker.core import BrokerCore
from broker.histogram import Histogram
from broker.protocol import Status

log = logging.getLogger("zbatch.metrics")
SCRAPE_TIMEOUT_S = 5.0
# Every reason is always exported (zero until it happens), so alerts can use rate() from the start.
REJECTION_REASONS = tuple(s.value for s in Status if s not in (Status.OK, Status.CANCELLED))
REMOVAL_REASONS = ("silent", "disconnected", "unreachable", "restarted", "reconnected")


class LoopCollector(Collector):
    """Runs ``build`` on ``loop`` for each scrape and waits for its metric families."""

    def __init__(self, loop: asyncio.AbstractEventLoop, build: Callable[[], list[Metric]]) -> None:
        self._loop = loop
        self._build = build

    def collect(self) -> Iterable[Metric]:
        result: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def build() -> None:
            try:
                result.set_result(self._build())
            except Exception as exc:  # shown to the scraper as a failed scrape
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(build)
        return result.result(SCRAPE_TIMEOUT_S)


def start_metrics(host: str, port: int, build: Callable[[], list[Metric]]) -> Callable[[], None]:
    """Serve ``build``'s families on http://host:port/metrics (port 0: off); returns what stops it.

    Call from the daemon's running event loop: each scrape builds its families there.
    """
    if not port:
        return lambda: None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LoopCollector(asyncio.get_running_loop(), build))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    log.info("Prometheus metrics on http://%s:%d/metrics", host, port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(SCRAPE_TIMEOUT_S)

    return stop


def histogram_family(name: str, documentation: str, labels: list[str],
                     histograms: Iterable[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, histogram in histograms:
        family.add_metric(values, histogram.cumulative(), histogram.total)
    return family


def broker_families(core: BrokerCore) -> list[Metric]:
    """The broker's metrics, read from the core's state at scrape time."""
    backlog = GaugeMetricFamily("zbatch_broker_backlog_items", "Items waiting for a worker", labels=["model"])
    workers = GaugeMetricFamily("zbatch_broker_workers", "Workers alive serving the model", labels=["model"])
    credit = GaugeMetricFamily("zbatch_broker_free_credit_items",
                               "Items the model's workers can still take", labels=["model"])
    dispatches = CounterMetricFamily("zbatch_broker_dispatches_total", "Requests sent to a worker",
                                     labels=["model"])
    answers = CounterMetricFamily("zbatch_broker_answers_total", "Requests answered, by status",
                                  labels=["model", "status"])
    for name, model in core.models.items():
        backlog.add_metric([name], model.backlog_items)
        workers.add_metric([name], len(model.workers))
        credit.add_metric([name], sum(max(0, w.free_credit) for w in model.workers.values()))
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
    return [backlog, workers, credit, dispatches, answers, queue_time, rejections, removals, expiries]
