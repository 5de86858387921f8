"""``zbatch-gateway --processes N``: N real gateway processes on one port, supervised by their parent.

Which process answered is in each answer's ``X-Zbatch-Pid``; the kernel
spreads new connections over the processes (SO_REUSEPORT), so a test opens
connections until it has seen every process.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.server import PROCESS_HEADER
from tests.daemons import Daemon, broker_stats, free_port, spawn, start_broker, start_worker, wait_until
from tests.zbatch.test_sdnotify import FakeSystemd
from worker.runners import DEFAULT_MODEL_NAME

START_TIMEOUT_S = 30.0
MINUTE_MS = 60_000
HELD_MS = 5 * MINUTE_MS  # a held request's deadline: past the start of a worker on a loaded host
HELD = 16  # requests held in flight: all 16 landing on one of two processes has odds of 1 in 32,768


def spawn_processes(log_dir: Path, processes: int = 2, frontend: str | None = None,
                    env: dict[str, str] | None = None, port: int | None = None, timeout_ms: int = 30_000) -> Daemon:
    port = free_port() if port is None else port
    daemon = spawn("gateway", "gateway", log_dir, env=env, host="127.0.0.1", port=port, processes=processes,
                   frontend=frontend or f"tcp://127.0.0.1:{free_port()}", timeout_ms=timeout_ms)
    daemon.endpoints["url"] = f"http://127.0.0.1:{port}"
    return daemon


def request(daemon: Daemon, method: str, path: str, body: bytes | None = None,
            timeout_s: float = 10.0) -> tuple[int, int, bytes]:
    """One request on a connection of its own: (status, the answering process's pid, body)."""
    port = int(daemon.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        return response.status, int(response.headers[PROCESS_HEADER]), response.read()
    finally:
        conn.close()


def children(pid: int) -> set[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def pids_answering(daemon: Daemon, count: int, timeout_s: float = START_TIMEOUT_S) -> set[int]:
    """Open connections to /healthz until ``count`` different processes have answered 200; their pids."""
    seen: set[int] = set()

    def enough() -> bool:
        daemon.check()
        try:
            status, pid, _ = request(daemon, "GET", "/healthz", timeout_s=2)
        except OSError:
            return False
        if status == 200:
            seen.add(pid)
        return len(seen) >= count

    wait_until(enough, timeout_s, f"{count} gateway processes to answer", daemon.log)
    return seen


@pytest.fixture
def gateway(log_dir: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(**options: object) -> Daemon:
        daemon = spawn_processes(log_dir, **options)  # type: ignore[arg-type]
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop(60)


def log_text(daemon: Daemon) -> str:
    return daemon.log_path.read_text(errors="replace")


def test_two_processes_answer_on_one_port_and_the_metrics_add_up(gateway: Callable[..., Daemon]) -> None:
    daemon = gateway(env={"ZBATCH_DEFAULT_MODEL": DEFAULT_MODEL_NAME})  # a model the settings name has its label
    pids = pids_answering(daemon, 2)
    assert pids == children(daemon.pid), "the two processes are the parent's children"
    # Inference requests answered by both processes: no broker listens, so each is 503 broker_unavailable.
    by_pid: dict[int, int] = {}
    body, path = json.dumps({"inputs": "hello"}).encode(), f"/models/{DEFAULT_MODEL_NAME}"
    with ThreadPoolExecutor(8) as pool:
        while len(by_pid) < 2 or sum(by_pid.values()) < 8:
            for status, pid, _ in pool.map(lambda _: request(daemon, "POST", path, body), range(8)):
                assert status == 503
                by_pid[pid] = by_pid.get(pid, 0) + 1
    total = sum(by_pid.values())
    series = f'zbatch_gateway_requests_total{{model="{DEFAULT_MODEL_NAME}",status="503"}} {total:.1f}'
    pages: dict[int, str] = {}
    while len(pages) < 2:  # whichever process a scrape reaches serves every process's counts
        status, pid, raw = request(daemon, "GET", "/metrics")
        assert status == 200
        pages[pid] = raw.decode()
    for page in pages.values():
        assert series in page.splitlines(), page
        assert "zbatch_gateway_requests_in_flight 0.0" in page.splitlines()
        assert re.search(r"^zbatch_gateway_request_duration_seconds_count\{.*\} " + f"{total:.1f}$", page, re.M)
        assert re.search(r"^zbatch_gateway_open_connections [1-9]", page, re.M), "this scrape's connection, at least"
    assert daemon.stop(60) == 0
    log = log_text(daemon)
    for pid in pids:
        assert f"zbatch-gateway[{pid}] zbatch.gateway: zbatch-gateway stopped" in log
    assert "zbatch-gateway stopped" in log.splitlines()[-1] and "Traceback" not in log


def test_a_killed_process_is_restarted_while_the_other_serves(gateway: Callable[..., Daemon]) -> None:
    daemon = gateway()
    first = pids_answering(daemon, 2)
    victim, survivor = sorted(first)
    signal_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    seen: set[int] = set()

    def replaced() -> bool:
        try:
            status, pid, _ = request(daemon, "GET", "/healthz")
        except ConnectionResetError:
            # Queued for the killed process in the instant before its socket closed: the kernel resets it
            # (unless net.ipv4.tcp_migrate_req=1 moves it to the other process: docs/deployment/gateway-processes.md).
            return False
        assert status == 200, "the port keeps answering"
        seen.add(pid)
        return bool(seen - first)

    wait_until(replaced, START_TIMEOUT_S, "a new gateway process", daemon.log)
    assert victim not in children(daemon.pid) and survivor in children(daemon.pid)
    assert time.monotonic() - signal_at < START_TIMEOUT_S
    log = log_text(daemon)
    assert re.search(rf"gateway-\d \(pid {victim}\) exited unexpectedly with signal SIGKILL after [\d.]+ s "
                     r"\(1 exit in a row\): restarting in 1\.0 s", log), log
    # The new process answers before the supervisor has read its READY: the line comes when it has.
    wait_until(lambda: re.search(r"gateway-\d \(pid \d+\) is ready again, [\d.]+ s after it exited \(start 2\)",
                                 log_text(daemon)), 30, "the supervisor to log the new process ready", daemon.log)


def hold_requests(daemon: Daemon, model: str, count: int) -> list[socket.socket]:
    """``count`` requests for ``model`` on connections of their own, sent and not yet read."""
    body = json.dumps({"inputs": ["held by the broker"]}).encode()
    port = int(daemon.url.rsplit(":", 1)[1])
    held = []
    for _ in range(count):
        caller = socket.create_connection(("127.0.0.1", port), timeout=60)
        caller.sendall(b"POST /models/%s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (model.encode(), len(body), body))
        held.append(caller)
    return held


def read_answer(caller: socket.socket) -> tuple[int, int]:
    """The status and answering pid of the one answer on ``caller``."""
    response = http.client.HTTPResponse(caller)
    response.begin()
    response.read()
    return response.status, int(response.headers[PROCESS_HEADER])


def backlog(broker: Daemon, model: str) -> int:
    stats = broker_stats(broker.frontend) or {"models": {}}
    return int(stats["models"].get(model, {}).get("backlog_items", 0))


def test_sigterm_drains_every_process(log_dir: Path, gateway: Callable[..., Daemon]) -> None:
    """Held requests wait for a worker started after the drain began: their deadline outlasts its start (40 s
    beside two busy loops)."""
    broker = start_broker(log_dir, no_worker_grace_ms=HELD_MS, timeout_ms=HELD_MS, max_timeout_ms=HELD_MS,
                          models=(DEFAULT_MODEL_NAME,))
    try:
        daemon = gateway(frontend=broker.frontend, timeout_ms=HELD_MS)
        pids = pids_answering(daemon, 2)
        held = hold_requests(daemon, DEFAULT_MODEL_NAME, HELD)
        wait_until(lambda: backlog(broker, DEFAULT_MODEL_NAME) == HELD, 10, "the requests to reach the broker",
                   daemon.log)
        daemon.signal(signal.SIGTERM)
        wait_until(lambda: log_text(daemon).count("no longer accepting connections") == 2, 10,
                   "both processes to drain", daemon.log)
        worker = start_worker(broker, log_dir, "w1", workers=1)  # the held requests can be answered now
        try:
            answers = [read_answer(caller) for caller in held]
        finally:
            for caller in held:
                caller.close()
            worker.stop()
        assert {status for status, _ in answers} == {200}
        assert {pid for _, pid in answers} == pids, "both processes drained their own requests"
        assert daemon.process.wait(30) == 0, daemon.log()
        assert not children(daemon.pid)
    finally:
        broker.stop()


def test_a_second_sigterm_stops_every_process_at_once(log_dir: Path, gateway: Callable[..., Daemon]) -> None:
    broker = start_broker(log_dir, no_worker_grace_ms=MINUTE_MS, models=("m",))
    try:
        daemon = gateway(frontend=broker.frontend)
        pids = pids_answering(daemon, 2)
        held = hold_requests(daemon, "m", HELD)
        try:
            wait_until(lambda: backlog(broker, "m") == HELD, 10, "the requests to reach the broker", daemon.log)
            daemon.signal(signal.SIGTERM)
            wait_until(lambda: log_text(daemon).count("no longer accepting connections") == 2, 10,
                       "both processes to drain", daemon.log)
            signalled = time.monotonic()
            daemon.signal(signal.SIGTERM)
            assert daemon.process.wait(5) == 128 + signal.SIGTERM, daemon.log()
            assert time.monotonic() - signalled < 5
        finally:
            for caller in held:
                caller.close()
        log = log_text(daemon)
        for pid in pids:
            assert f"zbatch-gateway[{pid}] zbatch.gateway: SIGTERM while stopping: exiting now" in log, log
        assert "SIGTERM while stopping: stopping every daemon at once" in log
        assert not any(Path(f"/proc/{pid}").exists() and pid in children(daemon.pid) for pid in pids)
    finally:
        broker.stop()


def test_ready_for_systemd_once_every_process_serves(log_dir: Path, gateway: Callable[..., Daemon]) -> None:
    systemd = FakeSystemd(f"@zbatch-test-{time.monotonic_ns()}")
    try:
        daemon = gateway(env={"NOTIFY_SOCKET": systemd.address})
        systemd.wait_for("READY=1", 1, START_TIMEOUT_S)
        assert log_text(daemon).count("zbatch-gateway listening on") == 2, "both listen before READY=1"
        assert systemd.count("READY=1") == 1, "the parent speaks for the children; they speak to it"
        daemon.signal(signal.SIGTERM)
        systemd.wait_for("STOPPING=1", 1, 10)
        assert daemon.process.wait(30) == 0
    finally:
        systemd.sock.close()


def test_a_taken_port_fails_the_start_in_one_line(log_dir: Path, gateway: Callable[..., Daemon]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        daemon = gateway(port=taken.getsockname()[1])
        assert daemon.process.wait(20) == 1
    log = log_text(daemon)
    assert "cannot serve on 127.0.0.1" in log and "Traceback" not in log
    assert "started gateway-" not in log, "no process was started"
