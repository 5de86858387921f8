"""Metrics, request ids in JSON logs, and the OpenAPI document, on one real stack.

Broker, one worker (the default model) and a gateway, all logging JSON; the
broker and the worker at debug level and with their /metrics pages on.  One
stack for the module: the model loads once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.errors import BROKER_ERRORS, HTTP_ERROR_CODES
from gateway.openapi import DOCUMENT
from tests.daemons import Daemon, free_port, http_json, start_broker, start_gateway, start_worker, wait_until
from worker.runners import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    log_dir = tmp_path_factory.mktemp("observed")
    daemons: dict[str, Daemon] = {}
    broker_port, worker_port = free_port(), free_port()
    try:
        daemons["broker"] = start_broker(log_dir, metrics_port=broker_port, log_format="json", log_level="debug")
        daemons["worker"] = start_worker(daemons["broker"], log_dir, "w1", metrics_port=worker_port,
                                         log_format="json", log_level="debug")
        daemons["gateway"] = start_gateway(daemons["broker"], log_dir, log_format="json", access_log="true")
        daemons["broker"].endpoints["metrics"] = f"http://127.0.0.1:{broker_port}/metrics"
        daemons["worker"].endpoints["metrics"] = f"http://127.0.0.1:{worker_port}/metrics"
        daemons["gateway"].endpoints["metrics"] = daemons["gateway"].url + "/metrics"
        yield daemons
    finally:
        for daemon in reversed(list(daemons.values())):
            daemon.stop()


def scrape(url: str) -> Samples:
    """Every sample of a metrics page, after checking the page with the parser and promtool."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), response.headers
        text = response.read().decode()
    # promtool comes with Debian's prometheus package, which scripts/test installs; a plain
    # pytest run without it still checks the page with prometheus_client's parser below.
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, f"{url}: {lint.stdout}{lint.stderr}"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def infer(gateway: Daemon, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    return http_json(f"{gateway.url}/models/{MODEL}", body, headers)


# ---------------------------------------------------------------- metrics


def test_gateway_counts_requests_by_model_and_status(observed: dict[str, Daemon]) -> None:
    gateway = observed["gateway"]
    before = scrape(gateway.endpoints["metrics"])
    assert infer(gateway, {"inputs": ["one", "two"]})[0] == 200
    assert infer(gateway, {"inputs": []})[0] == 400
    assert http_json(f"{gateway.url}/models/no-such-model", {"inputs": "x"})[0] == 404
    # Every dialect's inference route counts too.
    assert http_json(f"{gateway.url}/v1/embeddings", {"model": MODEL, "input": "three"})[0] == 200
    assert http_json(f"{gateway.url}/embed", {"inputs": "four"})[0] == 200
    tensor = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["five"]}]}
    assert http_json(f"{gateway.url}/v2/models/{MODEL}/infer", tensor)[0] == 200
    after = scrape(gateway.endpoints["metrics"])

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("zbatch_gateway_requests_total", model=MODEL, status="200") == 4
    assert delta("zbatch_gateway_requests_total", model=MODEL, status="400") == 1
    # Names nobody serves are pooled, so callers cannot create series at will.
    assert delta("zbatch_gateway_requests_total", model="other", status="404") == 1
    assert delta("zbatch_gateway_request_duration_seconds_count", model=MODEL) == 5
    assert delta("zbatch_gateway_request_duration_seconds_bucket", model=MODEL, le="+Inf") == 5
    assert value(after, "zbatch_gateway_requests_in_flight") == 0
    assert not any(labels and dict(labels).get("model") == "no-such-model" for _, labels in after)


def test_broker_exports_backlog_workers_dispatches_and_answers(observed: dict[str, Daemon]) -> None:
    broker, gateway = observed["broker"], observed["gateway"]
    before = scrape(broker.endpoints["metrics"])
    for _ in range(3):
        assert infer(gateway, {"inputs": "count me"})[0] == 200
    assert http_json(f"{gateway.url}/models/no-such-model", {"inputs": "x"})[0] == 404
    after = scrape(broker.endpoints["metrics"])

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("zbatch_broker_dispatches_total", model=MODEL) == 3
    assert delta("zbatch_broker_answers_total", model=MODEL, status="ok") == 3
    assert delta("zbatch_broker_queue_duration_seconds_count", model=MODEL) == 3
    assert delta("zbatch_broker_rejections_total", reason="unknown_model") == 1
    assert value(after, "zbatch_broker_workers", model=MODEL) == 1
    assert value(after, "zbatch_broker_backlog_items", model=MODEL) == 0
    assert value(after, "zbatch_broker_free_credit_items", model=MODEL) > 0
    for reason in ("silent", "disconnected", "unreachable", "restarted"):
        assert ("zbatch_broker_worker_removals_total", (("reason", reason),)) in after
    assert value(after, "zbatch_broker_heartbeat_expiries_total") == 0


def test_worker_exports_batches_items_and_their_sizes_and_times(observed: dict[str, Daemon]) -> None:
    worker, gateway = observed["worker"], observed["gateway"]
    before = scrape(worker.endpoints["metrics"])
    assert infer(gateway, {"inputs": ["a", "b", "c"]})[0] == 200
    after = scrape(worker.endpoints["metrics"])

    def delta(name: str) -> float:
        return value(after, name, model=MODEL) - value(before, name, model=MODEL)

    batches = delta("zbatch_worker_batches_total")
    assert batches >= 1  # three items of one request: one batch, unless the size cap splits it
    assert delta("zbatch_worker_items_total") == 3
    assert delta("zbatch_worker_batch_size_items_count") == batches
    assert delta("zbatch_worker_batch_size_items_sum") == 3
    assert delta("zbatch_worker_inference_duration_seconds_count") == batches
    assert delta("zbatch_worker_inference_duration_seconds_sum") > 0
    assert ("zbatch_worker_items_expired_total", (("model", MODEL),)) in after
    assert ("zbatch_worker_items_cancelled_total", (("model", MODEL),)) in after
    # the default 5 ms delay, or the model's fixed cost per batch once batches of two sizes have run
    assert 0 <= value(after, "zbatch_worker_batch_window_seconds", model=MODEL) <= 0.005


# ----------------------------------------------------------- request ids


def json_lines(daemon: Daemon) -> list[dict[str, Any]]:
    """The daemon's log lines that are JSON objects (libraries may print other lines to stderr)."""
    entries = []
    for line in daemon.log_path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def test_request_id_is_echoed_and_reaches_every_daemons_log(observed: dict[str, Daemon]) -> None:
    status, headers, _ = infer(observed["gateway"], {"inputs": "trace me"}, {"X-Request-ID": "test-trace-42"})
    assert status == 200 and headers["X-Request-ID"] == "test-trace-42"
    for name in ("gateway", "broker", "worker"):
        daemon = observed[name]

        def traced(daemon: Daemon = daemon) -> list[dict[str, Any]]:
            return [e for e in json_lines(daemon) if e.get("request_id") == "test-trace-42"]

        entry = wait_until(traced, 10, f"test-trace-42 in the {name} log", daemon.log)[0]
        assert {"ts", "level", "daemon", "pid", "logger", "message"} <= set(entry), entry
        assert entry["daemon"] == f"zbatch-{name}" and entry["ts"].endswith("+00:00"), entry


def test_request_ids_are_made_when_missing_or_unusable(observed: dict[str, Daemon]) -> None:
    gateway = observed["gateway"]
    made = []
    for headers in ({}, {"X-Request-ID": "x" * 129}):
        status, answer_headers, _ = infer(gateway, {"inputs": "x"}, headers)
        assert status == 200
        made.append(answer_headers["X-Request-ID"])
    assert all(len(rid) == 32 and set(rid) <= set("0123456789abcdef") for rid in made) and made[0] != made[1]
    status, answer_headers, body = http_json(f"{gateway.url}/nowhere", headers={"X-Request-ID": "lost-7"})
    assert status == 404 and body["error"]["code"] == "not_found"
    assert answer_headers["X-Request-ID"] == "lost-7"


# ---------------------------------------------------------------- OpenAPI


def test_openapi_document_is_valid_and_covers_every_route(observed: dict[str, Daemon]) -> None:
    status, _, document = http_json(observed["gateway"].url + "/openapi.json")
    assert status == 200
    validate(document)
    routes = {(route.method.lower(), route.resource.canonical)
              for route in create_app(GatewayConfig()).router.routes()
              if route.resource is not None and route.method != "HEAD"}
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert documented == routes


def test_openapi_document_names_every_error_the_gateway_gives() -> None:
    codes = DOCUMENT["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    answers = DOCUMENT["paths"]["/models/{model}"]["post"]["responses"]
    for status, code in [*BROKER_ERRORS.values(), *HTTP_ERROR_CODES.items()]:
        assert code in codes, code
        assert code in ("not_found", "method_not_allowed") or str(status) in answers, (status, code)


def test_schemathesis_finds_no_server_error(observed: dict[str, Daemon], tmp_path: Path) -> None:
    # 503 (overloaded, no worker) and 504 (deadline) are documented answers, not bugs.  Schemathesis
    # runs hypothesis without a deadline; 30 examples per operation and phase take about 20 s.
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "503", "504"]\n')
    command = [
        sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()",
        "--config-file", str(config), "run",
        observed["gateway"].url + "/openapi.json", "--checks", "not_a_server_error",
        "--max-examples", "30", "--workers", "2", "--seed", "42", "--generation-database", "none",
        "--no-color", "--report-dir", str(tmp_path / "report"),
    ]
    # cwd: schemathesis keeps a cache in the working directory, which must not be the repository.
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
