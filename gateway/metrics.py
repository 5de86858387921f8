"""The gateway's Prometheus metrics: inference requests by model and HTTP status, their duration,
and how many are in flight, plus the daemon's connections (gateway/connections.py);
``GET /metrics`` serves them in the text format.

Each application has its own registry, so several apps in one process (tests)
do not clash.  The model label comes from the URL or the body, which callers
control: to keep the number of series bounded, a model is named only once it
has answered a request successfully or is one the gateway is configured for;
any other name is counted as ``other``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from gateway.tracing import CLIENT_CLOSED

if TYPE_CHECKING:
    from gateway.connections import Connections

MODEL = web.RequestKey("model", str)  # set by the handlers once they know the model
OTHER_MODEL = "other"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INFERENCE_ROUTES = frozenset({"/", "/models/{model}", "/v1/embeddings"})


class GatewayMetrics:
    def __init__(self, models: set[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("zbatch_gateway_requests", "Inference requests answered, by model and HTTP status",
                                ["model", "status"], registry=self.registry)
        self.duration = Histogram("zbatch_gateway_request_duration_seconds", "Time to answer an inference request",
                                  ["model"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("zbatch_gateway_requests_in_flight", "Inference requests being answered",
                               registry=self.registry)
        self.active = 0  # read when Prometheus scrapes: no lock per request
        self.in_flight.set_function(lambda: self.active)
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

    def label(self, model: str | None, status: int) -> str:
        if model is not None and 200 <= status < 300:
            self.models.add(model)
        return model if model in self.models else OTHER_MODEL

    def watch(self, connections: Connections) -> None:
        """Serve the connection counts too (the gateway daemon's; an app served otherwise has none)."""
        self.registry.register(connections)

    def page(self, accept: str) -> web.Response:
        """The exposition format the scraper asks for, as prometheus_client's own server does."""
        encode, content_type = choose_encoder(accept)
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})


METRICS = web.AppKey("metrics", GatewayMetrics)


@web.middleware
async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time inference requests; the JSON error middleware inside has made every failure a response."""
    route = request.match_info.route.resource
    if request.method != "POST" or route is None or route.canonical not in INFERENCE_ROUTES:
        return await handler(request)
    metrics = request.app[METRICS]
    started = time.perf_counter()
    status = CLIENT_CLOSED
    metrics.active += 1
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        metrics.active -= 1
        metrics.answered(request.get(MODEL) or request.match_info.get("model"), status,
                         time.perf_counter() - started)


async def get_metrics(request: web.Request) -> web.Response:
    return request.app[METRICS].page(request.headers.get("Accept", ""))
