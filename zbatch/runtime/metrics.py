"""The metrics page every daemon can serve: families built on the event loop, served from a thread.

Daemons keep plain counters and :class:`~zbatch.runtime.histogram.Histogram` s;
a custom collector turns them into metric families only when Prometheus
scrapes, so the hot paths pay nothing for metrics.  The scrape is served from
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
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from zbatch.runtime.histogram import Histogram

log = logging.getLogger("zbatch.metrics")
SCRAPE_TIMEOUT_S = 5.0


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
