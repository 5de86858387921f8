"""sd_notify: exact datagrams on a real unix socket standing in for systemd's, from real daemons."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.daemons import (
    Daemon,
    broker_stats,
    free_port,
    http_status,
    spawn,
    start_broker,
    start_gateway,
    start_worker,
    wait_until,
)
from tests.fake_broker import BREAK_PUMP_ID
from tests.faults import END_THREAD_MARKER
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Request
from zbatch.runtime import sdnotify
from zbatch.runtime.daemon import FAULT_EXIT_CODE

FAST_WATCHDOG = "200000"  # WATCHDOG_USEC: a ping every 0.1 s
EXIT_WITHIN_S = 10.0


class FakeSystemd:
    """The receiving end of ``$NOTIFY_SOCKET``: collects every datagram the daemon sends."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.05)
        self.messages: list[str] = []

    def receive(self) -> list[str]:
        """Every datagram received so far, oldest first."""
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.messages

    def count(self, line: str) -> int:
        """How many datagrams so far hold ``line``."""
        return sum(line in message.splitlines() for message in self.receive())

    def wait_for(self, line: str, times: int, timeout_s: float) -> None:
        wait_until(lambda: self.count(line) >= times, timeout_s, f"{times} x {line}",
                   lambda: f"received: {self.messages}")


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", fake.address)
    yield fake
    fake.sock.close()


def test_notify_sends_the_exact_bytes(systemd: FakeSystemd) -> None:
    assert sdnotify.notify("READY=1\nSTATUS=serving")
    assert systemd.sock.recv(4096) == b"READY=1\nSTATUS=serving"


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSystemd(f"@zbatch-test-{os.getpid()}-{time.monotonic_ns()}")
    monkeypatch.setenv("NOTIFY_SOCKET", fake.address)
    try:
        assert sdnotify.notify("WATCHDOG=1")
        assert fake.sock.recv(4096) == b"WATCHDOG=1"
    finally:
        fake.sock.close()


def test_notify_outside_systemd_does_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not sdnotify.notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert not sdnotify.notify("READY=1")


def test_watchdog_interval_is_half_the_timeout_and_only_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval_s() is None


def test_notifier_paces_watchdog_and_status(systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    now = [100.0]
    notifier = sdnotify.Notifier(lambda: "all good", clock=lambda: now[0])
    notifier.ready()
    for step in range(10):  # 0.0 to 0.9 s: one ping, one status
        now[0] = 100.0 + step / 10
        notifier.tick()
    now[0] = 101.0
    notifier.tick()
    assert systemd.receive() == ["READY=1\nSTATUS=all good", "WATCHDOG=1", "STATUS=all good", "WATCHDOG=1"]


def test_broker_tells_systemd_ready_watchdog_and_stopping(systemd: FakeSystemd, log_dir: Path) -> None:
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "500000"}
    broker = start_broker(log_dir, env=env, models=("m",))
    try:
        systemd.wait_for("READY=1", 1, 10)
        assert systemd.messages[0] == "READY=1\nSTATUS=0 worker(s), 0 item(s) waiting"
        pings, started = systemd.count("WATCHDOG=1"), time.monotonic()
        systemd.wait_for("WATCHDOG=1", pings + 4, 5)
        assert time.monotonic() - started >= 0.6, "a ping every 0.25 s, not more often"
        assert systemd.count("STOPPING=1") == 0
        broker.signal(signal.SIGTERM)
        systemd.wait_for("STOPPING=1", 1, 10)
        assert broker.process.wait(10) == 0
    finally:
        broker.stop()


def test_gateway_tells_systemd_ready_watchdog_and_stopping(systemd: FakeSystemd, log_dir: Path) -> None:
    broker = start_broker(log_dir, models=("m",))
    gateway = start_gateway(broker, log_dir, env={"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "500000"})
    try:
        systemd.wait_for("READY=1", 1, 10)
        assert http_status(gateway.url + "/healthz") == 200
        systemd.wait_for("WATCHDOG=1", 3, 5)
        gateway.signal(signal.SIGTERM)
        systemd.wait_for("STOPPING=1", 1, 10)
        assert gateway.process.wait(20) == 0
    finally:
        gateway.stop()
        broker.stop()


def test_worker_is_ready_only_once_the_broker_has_registered_it(systemd: FakeSystemd, log_dir: Path) -> None:
    backend = f"tcp://127.0.0.1:{free_port()}"
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "1000000"}
    worker = spawn("worker", "w1", log_dir, env=env, backend=backend, name="w1", workers=2)
    broker = None
    try:
        wait_until(lambda: "serving" in worker.log_path.read_text(), 120, "the model to load", worker.log)
        systemd.wait_for("WATCHDOG=1", 2, 10)  # loaded and pinging, but with no broker to register with
        assert systemd.count("READY=1") == 0, systemd.messages
        broker = start_broker(log_dir, backend=backend, models=("m",))
        systemd.wait_for("READY=1", 1, 30)
        stats = broker_stats(broker.frontend)
        assert stats is not None and [w["name"] for w in stats["workers"]] == ["w1"]
        worker.signal(signal.SIGTERM)
        systemd.wait_for("STOPPING=1", 1, 10)
        assert worker.process.wait(20) == 0
    finally:
        worker.stop()
        if broker is not None:
            broker.stop()


def send_request(frontend: str, request_id: bytes, model: str, inputs: list[str]) -> None:
    """One request from a raw DEALER that does not wait for the answer."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.connect(frontend)
        payload = payloads.encode_payload({"inputs": inputs, "parameters": {}})
        dealer.send_multipart(wire.encode_request(Request(request_id, model, len(inputs), payload)))
        dealer.close(linger=2000)  # until the message has left
    finally:
        context.term()


def assert_died_of(daemon: Daemon, systemd: FakeSystemd, essential: str, error: str) -> None:
    """Exit status 70 at once, a log line naming the task and its error, and nothing for systemd after
    the STATUS that says why: in particular no WATCHDOG=1 once the task was dead."""
    assert daemon.process.wait(EXIT_WITHIN_S) == FAULT_EXIT_CODE, daemon.log()
    log = daemon.log_path.read_text()
    assert f"{essential} failed: {error}" in log and "exiting with status 70 for a restart" in log, daemon.log()
    messages = systemd.receive()
    assert messages[-1].startswith(f"STATUS=exited: {essential} failed: {error}"), messages[-3:]


def test_a_broker_whose_socket_pump_fails_stops_pinging_and_exits_70(systemd: FakeSystemd, log_dir: Path) -> None:
    frontend = f"tcp://127.0.0.1:{free_port()}"
    settings = {"frontend": frontend, "backend": f"tcp://127.0.0.1:{free_port()}", "models": "m"}
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": FAST_WATCHDOG}
    faulty = spawn("tests.fake_broker", "fake-broker", log_dir, env=env, **settings)
    try:
        systemd.wait_for("READY=1", 1, 30)
        systemd.wait_for("WATCHDOG=1", 3, 5)
        send_request(frontend, BREAK_PUMP_ID, "m", ["x"])
        assert_died_of(faulty, systemd, "the socket pump", "RuntimeError('FAKE: a bug in the routing')")
    finally:
        faulty.stop()


def test_a_worker_whose_inference_thread_dies_stops_pinging_and_exits_70(systemd: FakeSystemd, log_dir: Path) -> None:
    """The FAKE runner ends the inference thread the way model code calling sys.exit() would."""
    broker = start_broker(log_dir)
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": FAST_WATCHDOG}
    worker = start_worker(broker, log_dir, "w1", env=env, task="python:tests.faults:FaultInjectingEmbeddings",
                          model_name=DEFAULT_MODEL_NAME)
    try:
        systemd.wait_for("READY=1", 1, 30)
        pings = systemd.count("WATCHDOG=1")
        systemd.wait_for("WATCHDOG=1", pings + 3, 5)
        send_request(broker.frontend, b"ends the thread", DEFAULT_MODEL_NAME, [END_THREAD_MARKER])
        error = "SystemExit(\"FAKE: the model's code called sys.exit()\")"
        assert_died_of(worker, systemd, "the inference thread", error)
    finally:
        worker.stop()
        broker.stop()
