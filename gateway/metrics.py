"""The gateway's Prometheus metrics: inference requests by model and HTTP status, their duration,
and how many are in flight, gRPC calls by method and status code (gateway/kserve_grpc/), plus the
daemon's connections (gateway/connections.py); ``GET /metrics`` serves them in the text format.

Each application has its own registry, so several apps in one process (tests)
do not clash.  The model label comes from the URL or the body, which callers
control: to keep the number of series bounded, a model is named only once it
has answered a request successfully or is one the gateway is configured for;
any other name is counted as ``other``.

Several gateway processes on one port (``--processes``) share one page:
their parent gives each the same ``PROMETHEUS_MULTIPROC_DIR``, where
prometheus_client's multiprocess mode keeps every process's values in a
memory-mapped file of its own, and whichever process a scrape reaches sums
them all.  Counts of a process that has exited stay in the sums (a counter
never goes back); the in-flight and open-connection gauges count live
processes only (``livesum``: the parent removes a dead child's gauge file).
Without that variable nothing here changes: one process, one registry, the
in-flight gauge read from a plain integer at scrape time.
"""

from __future__ import annotations

import os
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.connections import Connections
from gateway.tracing import CLIENT_CLOSED

MODEL = web.RequestKey("model", str)  # set by the handlers once they know the model
OTHER_MODEL = "other"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: set, every process writes its values there


def shared_dir() -> str | None:
    """The folder several gateway processes share their metrics in, if this process is one of them."""
    return os.environ.get(MULTIPROCESS_ENV) or None


class GatewayMetrics:
    def __init__(self, models: set[str]) -> None:
        self.shared = shared_dir()
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("zbatch_gateway_requests", "Inference requests answered, by model and HTTP status",
                                ["model", "status"], registry=self.registry)
        self.duration = Histogram("zbatch_gateway_request_duration_seconds", "Time to answer an inference request",
                                  ["model"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.grpc_calls = Counter("zbatch_gateway_grpc_calls", "KServe v2 gRPC calls answered, by method and status "
                                  "code", ["method", "code"], registry=self.registry)
        self.grpc_duration = Histogram("zbatch_gateway_grpc_call_duration_seconds", "Time to answer a gRPC call",
                                       ["method"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.active = 0  # read when Prometheus scrapes: no lock per request
        self.shared_in_flight: Gauge | None = None  # several processes: the gauge they sum, kept per request
        self._page = self.registry
        if self.shared is None:
            self.in_flight = Gauge("zbatch_gateway_requests_in_flight", "Inference requests being answered",
                                   registry=self.registry)
            self.in_flight.set_function(lambda: self.active)
        else:
            self.in_flight = self.shared_in_flight = Gauge(
                "zbatch_gateway_requests_in_flight", "Inference requests being answered",
                multiprocess_mode="livesum", registry=self.registry)
            self._page = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(self._page, path=self.shared)  # type: ignore[no-untyped-call]
        self.models = set(models)
        # Labelled children by (model, status): labels() takes a lock and builds a key on every call.
        self._answered: dict[tuple[str, int], tuple[Any, Any]] = {}

    def answered(self, model: str | None, status: int, seconds: float) -> None:
        """Count one inference request and its duration under its model's label."""
        key = (model or "", status)
        children = self._answered.get(key)
        if children is None:
            label = self.label(model, status)
            children = (self.requests.labels(label, str(status)), self.duration.labels(label))
            if label == model:  # only known models: callers choose the names, the cache must stay small
                self._answered[key] = children
        counter, histogram = children
        counter.inc()
        histogram.observe(seconds)

    def started(self) -> None:
        """One more inference request in flight, whatever its protocol."""
        self.active += 1
        if self.shared_in_flight is not None:
            self.shared_in_flight.inc()

    def finished(self) -> None:
        self.active -= 1
        if self.shared_in_flight is not None:
            self.shared_in_flight.dec()

    def grpc_answered(self, method: str, code: str, seconds: float) -> None:
        """Count one gRPC call (the method and code names are the protocol's: a bounded set)."""
        self.grpc_calls.labels(method, code).inc()
        self.grpc_duration.labels(method).observe(seconds)

    def label(self, model: str | None, status: int) -> str:
        if model is not None and 200 <= status < 300:
            self.models.add(model)
        return model if model in self.models else OTHER_MODEL

    def connections(self, limit: int, header_timeout_s: float) -> Connections:
        """The daemon's :class:`Connections`, whose counts this page serves (an app served otherwise has none)."""
        if self.shared is not None:
            return SharedConnections(limit, header_timeout_s)  # written to the shared folder as they change
        connections = Connections(limit, header_timeout_s)
        self.registry.register(connections)
        return connections

    def page(self, accept: str) -> web.Response:
        """The exposition format the scraper asks for, as prometheus_client's own server does."""
        encode, content_type = choose_encoder(accept)
        return web.Response(body=encode(self._page), headers={"Content-Type": content_type})


class SharedConnections(Connections):
    """:class:`Connections` whose counts also go to the folder several gateway processes share.

    The counts stay plain attributes for the connections' code; assigning one
    writes its shared value as well (a few memory writes per connection).
    """

    def __init__(self, limit: int, header_timeout_s: float) -> None:
        self._open_gauge = Gauge("zbatch_gateway_open_connections", "HTTP connections open",
                                 multiprocess_mode="livesum", registry=None)
        self._refused_counter = Counter(
            "zbatch_gateway_refused_connections",
            "New connections answered 503 and closed at once, because max_open_connections were open", registry=None)
        self._timeouts_counter = Counter(
            "zbatch_gateway_header_timeouts",
            "Connections closed because a request's headers did not arrive within header_timeout_ms", registry=None)
        self._open = self._refused = self._header_timeouts = 0
        super().__init__(limit, header_timeout_s)

    @property
    def open(self) -> int:
        return self._open

    @open.setter
    def open(self, value: int) -> None:
        self._open = value
        self._open_gauge.set(value)

    @property
    def refused(self) -> int:
        return self._refused

    @refused.setter
    def refused(self, value: int) -> None:
        self._refused_counter.inc(max(0, value - self._refused))
        self._refused = value

    @property
    def header_timeouts(self) -> int:
        return self._header_timeouts

    @header_timeouts.setter
    def header_timeouts(self, value: int) -> None:
        self._timeouts_counter.inc(max(0, value - self._header_timeouts))
        self._header_timeouts = value


METRICS = web.AppKey("metrics", GatewayMetrics)


@web.middleware
async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time inference requests (every POST route of every dialect asks a model); the JSON error
    middleware inside has made every failure a response."""
    if request.method != "POST" or request.match_info.route.resource is None:
        return await handler(request)
    metrics = request.app[METRICS]
    started = time.perf_counter()
    status = CLIENT_CLOSED
    metrics.started()
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        metrics.finished()
        metrics.answered(request.get(MODEL) or request.match_info.get("model"), status,
                         time.perf_counter() - started)


async def get_metrics(request: web.Request) -> web.Response:
    return request.app[METRICS].page(request.headers.get("Accept", ""))
