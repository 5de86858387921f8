"""The daemon lifecycle's stop rule on the three real daemons: the first SIGTERM or SIGINT drains, a second
one during the drain exits at once with 128 + its number.

Each daemon is caught in a drain that would last a minute: the broker holds a
request no worker can take, the gateway a request the broker holds, the
worker a batch that hangs (the FAKE runner of :mod:`tests.faults`).
(What systemd hears when an essential task dies is in test_sdnotify.py.)
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.daemons import Daemon, broker_stats, start_broker, start_gateway, start_worker, wait_until
from tests.faults import HANG_MARKER
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Request

MINUTE_MS = 60_000  # drains, deadlines and grace periods long enough never to end during a test
EXIT_WITHIN_S = 5.0
SIGNAL_PAIRS = [(signal.SIGTERM, signal.SIGTERM), (signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT)]


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def hold_request(context: zmq.Context[zmq.Socket[bytes]], frontend: str, model: str, text: str) -> None:
    """Send one request with a minute's deadline from a raw DEALER that never reads its answer."""
    dealer = context.socket(zmq.DEALER)
    dealer.connect(frontend)
    payload = payloads.encode_payload({"inputs": [text], "parameters": {}})
    dealer.send_multipart(wire.encode_request(Request(b"held", model, 1, payload, MINUTE_MS)))


def model_stats(daemon: Daemon, model: str) -> dict[str, Any]:
    stats = broker_stats(daemon.frontend) or {"models": {}}
    return dict(stats["models"].get(model, {}))


def second_signal_ends_the_drain(daemon: Daemon, program: str, draining: str, first: signal.Signals,
                                 second: signal.Signals) -> None:
    """``first`` starts the drain (its log line says ``draining``); ``second`` must end the process at once."""
    daemon.signal(first)
    wait_until(lambda: draining in daemon.log_path.read_text(), 10, f"{daemon.name} to drain", daemon.log)
    signalled = time.monotonic()
    daemon.signal(second)
    assert daemon.process.wait(EXIT_WITHIN_S) == 128 + second, daemon.log()
    assert time.monotonic() - signalled < EXIT_WITHIN_S
    log = daemon.log_path.read_text()
    assert f"{first.name}: stopping (a second SIGTERM or SIGINT exits at once)" in log
    assert f"{second.name} while stopping: exiting now, without finishing the drain" in log
    assert f"{program} stopped" not in log and "Traceback" not in log, daemon.log()


@pytest.mark.parametrize(("first", "second"), SIGNAL_PAIRS, ids=lambda sig: sig.name)
def test_a_second_stop_signal_ends_a_broker_drain_at_once(
        log_dir: Path, context: zmq.Context[zmq.Socket[bytes]], first: signal.Signals, second: signal.Signals) -> None:
    broker = start_broker(log_dir, models=("m",), no_worker_grace_ms=MINUTE_MS, drain_timeout_ms=MINUTE_MS,
                          max_timeout_ms=MINUTE_MS)
    try:
        hold_request(context, broker.frontend, "m", "no worker will ever take this")
        wait_until(lambda: model_stats(broker, "m").get("backlog_items") == 1, 10, "the request to wait", broker.log)
        second_signal_ends_the_drain(broker, "zbatch-broker", "draining: refusing new requests", first, second)
    finally:
        broker.stop()


def test_a_second_stop_signal_ends_a_gateway_drain_at_once(log_dir: Path) -> None:
    broker = start_broker(log_dir, models=("m",), no_worker_grace_ms=MINUTE_MS)
    gateway = start_gateway(broker, log_dir)
    body = json.dumps({"inputs": ["held by the broker"]}).encode()
    port = int(gateway.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as caller:  # it waits, and never reads
            caller.sendall(b"POST /models/m HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: model_stats(broker, "m").get("backlog_items") == 1, 10,
                       "the request to reach the broker", gateway.log)
            second_signal_ends_the_drain(gateway, "zbatch-gateway", "no longer accepting connections",
                                         signal.SIGINT, signal.SIGINT)
    finally:
        gateway.stop()
        broker.stop()


def test_a_second_stop_signal_ends_a_worker_drain_at_once(
        log_dir: Path, context: zmq.Context[zmq.Socket[bytes]]) -> None:
    broker = start_broker(log_dir, max_timeout_ms=MINUTE_MS)
    worker = start_worker(broker, log_dir, "w1", task="python:tests.faults:FaultInjectingEmbeddings",
                          model_name=DEFAULT_MODEL_NAME, drain_timeout_ms=MINUTE_MS, batch_timeout_ms=MINUTE_MS)
    try:
        hold_request(context, broker.frontend, DEFAULT_MODEL_NAME, HANG_MARKER)

        def in_flight() -> int:
            stats = broker_stats(broker.frontend) or {"workers": []}
            return sum(w["in_flight"] for w in stats["workers"])

        wait_until(lambda: in_flight() == 1, 30, "the hanging batch to start", worker.log)
        second_signal_ends_the_drain(worker, "zbatch-worker", "draining: telling the broker",
                                     signal.SIGTERM, signal.SIGTERM)
    finally:
        worker.stop()
        broker.stop()
