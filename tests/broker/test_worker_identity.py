"""With CURVE a worker is who its key says it is: hostile peers with real keys against a real broker.

The broker runs CURVE with a short liveness window (0.2 s heartbeats, 5 of them), the worker ``w0`` is
the real daemon with the real model and its own key, and a client keeps sending requests for the whole
of every attack: each one must be answered.  The attackers are raw pyzmq DEALERs holding allowed keys,
so their handshakes succeed; what is refused is the name.  After each attack the broker, the worker and
the traffic must still be fine, and the broker's log must say what it refused.  Last, the price of no
ROUTER_HANDOVER under CURVE is checked: a worker whose host died still gets its name back.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.daemons import ROOT, Daemon, broker_stats, spawn, start_broker, wait_for_worker, wait_until
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient
from zbatch.protocol import wire
from zbatch.protocol.wire import ModelInfo, Ready, Reply, Status
from zbatch.runtime.curve import CurveKeys
from zbatch.testing import daemon_env
from zbatch.tools.keys import make_key_pair

MODEL = DEFAULT_MODEL_NAME
HEARTBEAT_MS = 200
LIVENESS = 5
GRACE_S = HEARTBEAT_MS * LIVENESS / 1000  # how long a connection may show nothing under its key's name
CUT = "cut the backend connection from 127.0.0.1:"
Context = zmq.Context[zmq.Socket[bytes]]


class Keys:
    """A broker pair, one client and three workers (w0, w1, w2), each allowed in its own folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.clients, self.workers = folder / "clients", folder / "workers"
        self.clients.mkdir()
        self.workers.mkdir()
        for name in ("broker", "client", "w0", "w1", "w2"):
            make_key_pair(folder, name)
        shutil.copy(folder / "client.key", self.clients)
        for name in ("w0", "w1", "w2"):
            shutil.copy(folder / f"{name}.key", self.workers)

    def secret(self, name: str) -> str:
        return str(self.folder / f"{name}.key_secret")

    def of(self, name: str) -> CurveKeys:
        return CurveKeys.from_files(str(self.folder / "broker.key"), self.secret(name))


@dataclass
class Stack:
    keys: Keys
    broker: Daemon
    worker: Daemon

    def stats(self) -> dict[str, Any]:
        stats = broker_stats(self.broker.frontend, timeout_ms=5_000, curve=self.keys.of("client"))
        assert stats is not None, self.broker.log()
        return stats

    def workers(self) -> list[tuple[str, str, int]]:
        """(name, routing id, pid) of every registered worker."""
        return sorted((w["name"], bytes.fromhex(w["identity"]).decode(errors="replace"), w["pid"])
                      for w in self.stats()["workers"])

    def log_since(self, mark: int) -> str:
        return self.broker.log_path.read_text(errors="replace")[mark:]

    def log_mark(self) -> int:
        return len(self.broker.log_path.read_text(errors="replace"))

    def healthy(self) -> None:
        """Broker and worker alive, w0 the only worker named w0 and the real daemon, a request answered."""
        self.broker.check()
        self.worker.check()
        assert ("w0", "w0", self.worker.pid) in self.workers(), self.workers()
        assert [w for w in self.workers() if w[0] == "w0" or w[1] == "w0"] == [("w0", "w0", self.worker.pid)]

        async def one() -> list[Any]:
            async with AsyncClient(self.broker.frontend, curve=self.keys.of("client")) as client:
                return await client.infer(MODEL, ["after the attack"], timeout_ms=30_000)

        assert len(asyncio.run(one())) == 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    keys = Keys(tmp_path_factory.mktemp("keys"))
    logs = tmp_path_factory.mktemp("logs")
    broker = start_broker(logs, curve=keys.of("client"), heartbeat_ms=HEARTBEAT_MS, heartbeat_liveness=LIVENESS,
                          curve_secret_key_file=keys.secret("broker"), curve_clients_dir=str(keys.clients),
                          curve_workers_dir=str(keys.workers))
    try:
        # No --name: under CURVE the worker's name is its key's, w0.
        worker = spawn("worker", "w0", logs, backend=broker.backend, workers=1, heartbeat_ms=HEARTBEAT_MS,
                       curve_server_key_file=str(keys.folder / "broker.key"), curve_secret_key_file=keys.secret("w0"))
    except BaseException:
        broker.stop()
        raise
    try:
        wait_for_worker(broker, worker)
    except BaseException:
        worker.stop()
        broker.stop()
        raise
    yield Stack(keys, broker, worker)
    worker.stop()
    broker.stop()


@pytest.fixture
def context() -> Iterator[Context]:
    context: Context = zmq.Context()
    yield context
    context.destroy(linger=0)


@dataclass
class Traffic:
    """A client sending requests, four at a time, from before an attack until after it; every answer is checked.

    :meth:`expect_answers` waits, while the attacker is at work, for requests answered meanwhile; on
    leaving the ``with`` block traffic goes on until :data:`AFTER` more have come.
    """

    AFTER = 5

    frontend: str
    curve: CurveKeys
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Traffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        self.expect_answers(1)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.expect_answers(self.AFTER)
        finally:
            self._stop.set()
            assert self._thread is not None
            self._thread.join(60)

    def expect_answers(self, count: int = 3) -> None:
        """Until ``count`` more requests are answered (a slow, busy machine gets a minute)."""
        end = self.answered + count
        wait_until(lambda: self.answered >= end or self.failures, 60, f"{count} more answers")

    def check(self) -> None:
        """Every request was answered."""
        assert not self.failures, self.failures[:5]

    async def _run(self) -> None:
        async with AsyncClient(self.frontend, curve=self.curve) as client:
            await asyncio.gather(*(self._loop(client, lane) for lane in range(4)))

    async def _loop(self, client: AsyncClient, lane: int) -> None:
        count = 0
        while not self._stop.is_set():
            count += 1
            try:
                outputs = await client.infer(MODEL, [f"lane {lane} request {count}"], timeout_ms=30_000)
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if len(outputs) == 1 and len(outputs[0]) == 384:
                self.answered += 1
            else:
                self.failures.append(f"a wrong answer: {outputs!r:.100}")


class Rogue:
    """A raw DEALER with someone's key and a routing id of its choosing, and a monitor on its connection."""

    EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_DISCONNECTED)

    def __init__(self, context: Context, endpoint: str, curve: CurveKeys, routing_id: bytes) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, routing_id)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 60_000)  # one connection: a cut stays a cut
        curve.apply(self.socket)
        self.monitor = self.socket.get_monitor_socket(self.EVENTS)
        self.socket.connect(endpoint)
        self.received: list[list[bytes]] = []

    def next_event(self, timeout_s: float) -> int:
        assert self.monitor.poll(int(timeout_s * 1000)), f"no connection event within {timeout_s} s"
        return int(recv_monitor_message(self.monitor)["event"])

    def send(self, frames: list[bytes]) -> None:
        with contextlib.suppress(zmq.Again):
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)

    def pretend_to_serve(self, name: str, seconds: float) -> None:
        """READY with a huge capacity, heartbeats and forged replies, while keeping whatever arrives."""
        self.send(wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4096),), 65_536, name)))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.send(wire.encode_heartbeat())
            self.send(wire.encode_reply(Reply(b"\x00" * 12, Status.OK, "", b"forged")))
            while self.socket.poll(0):
                self.received.append(self.socket.recv_multipart())
            time.sleep(0.05)

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()


def test_another_key_cannot_take_a_registered_workers_name(stack: Stack, context: Context) -> None:
    """w1's key, routing id w0, while w0 serves: never routed, cut, logged; w0 never notices."""
    stack.healthy()
    mark = stack.log_mark()
    with Traffic(stack.broker.frontend, stack.keys.of("client")) as traffic:
        rogue = Rogue(context, stack.broker.backend, stack.keys.of("w1"), b"w0")
        try:
            # w1's key is allowed, so the handshake itself succeeds: it is the name that is refused.
            assert rogue.next_event(10) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            rogue.pretend_to_serve("w0", GRACE_S / 2)
            traffic.expect_answers()
            assert stack.workers() == [("w0", "w0", stack.worker.pid)]
            assert rogue.next_event(GRACE_S + 10) == zmq.EVENT_DISCONNECTED  # the broker cut it
            assert rogue.received == [], "the broker sent something to the impostor"
        finally:
            rogue.close()
    traffic.check()
    assert CUT in stack.log_since(mark), stack.broker.log()
    stack.healthy()


def test_another_key_cannot_hold_a_free_name(stack: Stack, context: Context) -> None:
    """w1's key, routing id w2 while w2 is away: every message refused and logged, cut, and w2 then registers."""
    mark = stack.log_mark()
    with Traffic(stack.broker.frontend, stack.keys.of("client")) as traffic:
        squatter = Rogue(context, stack.broker.backend, stack.keys.of("w1"), b"w2")
        try:
            assert squatter.next_event(10) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            squatter.pretend_to_serve("w2", GRACE_S / 2)
            traffic.expect_answers()
            assert [w for w in stack.workers() if "w2" in w[:2]] == []
            assert squatter.next_event(GRACE_S + 10) == zmq.EVENT_DISCONNECTED
            assert squatter.received == []
        finally:
            squatter.close()
        log = stack.log_since(mark)
        assert "refused a message on the backend from a connection with key 'w1' under routing id 'w2'" in log, log
        assert CUT in log, log

        # The name is free again: the real w2 registers under it.
        w2 = Rogue(context, stack.broker.backend, stack.keys.of("w2"), b"w2")
        try:
            assert w2.next_event(10) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            w2.send(wire.encode_ready(Ready((ModelInfo("other-model", "embeddings", 4),), 8, "w2")))
            wait_until(lambda: ("w2", "w2") in [w[:2] for w in stack.workers()], 10, "w2 to register",
                       stack.broker.log)
            w2.send(wire.encode_disconnect("done"))
            wait_until(lambda: "w2" not in [w[0] for w in stack.workers()], 10, "w2 to leave", stack.broker.log)
        finally:
            w2.close()
    traffic.check()
    stack.healthy()


def test_a_worker_cannot_announce_another_workers_name(stack: Stack, context: Context) -> None:
    """w1 under its own routing id, but READY says w0: refused and logged; READY as w1 then registers."""
    mark = stack.log_mark()
    with Traffic(stack.broker.frontend, stack.keys.of("client")) as traffic:
        w1 = Rogue(context, stack.broker.backend, stack.keys.of("w1"), b"w1")
        try:
            assert w1.next_event(10) == zmq.EVENT_HANDSHAKE_SUCCEEDED
            w1.pretend_to_serve("w0", GRACE_S / 2)
            traffic.expect_answers()
            assert [w for w in stack.workers() if w[1] == "w1"] == []
            assert "refused READY from worker 'w1': it calls itself 'w0'" in stack.log_since(mark)
            w1.send(wire.encode_ready(Ready((ModelInfo("other-model", "embeddings", 4),), 8, "w1")))
            wait_until(lambda: ("w1", "w1") in [w[:2] for w in stack.workers()], 10, "w1 to register",
                       stack.broker.log)
            w1.send(wire.encode_disconnect("done"))
            wait_until(lambda: "w1" not in [w[0] for w in stack.workers()], 10, "w1 to leave", stack.broker.log)
        finally:
            w1.close()
    traffic.check()
    stack.healthy()


def test_a_client_key_cannot_register_a_worker(stack: Stack, context: Context) -> None:
    """The client's key is allowed on the frontend only: refused in the handshake on the backend, and logged."""
    mark = stack.log_mark()
    with Traffic(stack.broker.frontend, stack.keys.of("client")) as traffic:
        intruder = Rogue(context, stack.broker.backend, stack.keys.of("client"), b"client")
        try:
            assert intruder.next_event(10) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
            intruder.pretend_to_serve("client", GRACE_S / 2)
            traffic.expect_answers()
            assert intruder.received == []
        finally:
            intruder.close()
    traffic.check()
    assert "client" not in [w[0] for w in stack.workers()]
    log = stack.log_since(mark)
    assert "refused a connection from 127.0.0.1 on the workers socket: its key" in log, log
    assert str(stack.keys.workers) in log
    stack.healthy()


# A worker process in a few lines: READY until the broker answers, then a heartbeat every interval.
FAKE_WORKER = """
import os, sys, time, zmq
from zbatch.protocol import wire
from zbatch.protocol.wire import ModelInfo, Ready
from zbatch.runtime.curve import CurveKeys
backend, server_key, secret_key, name = sys.argv[1:5]
socket = zmq.Context().socket(zmq.DEALER)
socket.setsockopt(zmq.ROUTING_ID, name.encode())
CurveKeys.from_files(server_key, secret_key).apply(socket)
socket.connect(backend)
interval, heard = float(sys.argv[5]) / 1000, False
while True:
    socket.send_multipart(wire.encode_heartbeat() if heard else
                          wire.encode_ready(Ready((ModelInfo("other-model", "embeddings", 4),), 8, name,
                                                  pid=os.getpid())))
    until = time.monotonic() + interval
    while socket.poll(max(0, int((until - time.monotonic()) * 1000))):
        socket.recv_multipart()
        heard = True
"""


def test_a_worker_whose_host_died_gets_its_name_back(stack: Stack) -> None:
    """No handover under CURVE: the dead connection must be closed by the broker (ZMTP heartbeats), then
    the restarted worker registers under its name.  A stopped process stands for the dead host: its
    kernel keeps the TCP connection open, but nothing answers on it."""
    def fake_w2() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", FAKE_WORKER, stack.broker.backend,
                                 str(stack.keys.folder / "broker.key"), stack.keys.secret("w2"), "w2",
                                 str(HEARTBEAT_MS)], env=daemon_env(), cwd=ROOT)

    def w2_pid() -> int | None:
        return next((pid for name, _, pid in stack.workers() if name == "w2"), None)

    dead, restarted = fake_w2(), None
    try:
        wait_until(lambda: w2_pid() == dead.pid, 20, "the first w2 to register", stack.broker.log)
        with Traffic(stack.broker.frontend, stack.keys.of("client")) as traffic:
            dead.send_signal(signal.SIGSTOP)
            restarted = fake_w2()
            new_pid = restarted.pid
            traffic.expect_answers()
            # Registered again: the READY of the new connection reached the core (without the broker's
            # ZMTP heartbeats it never does: the dead connection keeps the name).
            wait_until(lambda: w2_pid() == new_pid, 30, "the restarted w2 to register", stack.broker.log)
        traffic.check()
        assert w2_pid() == new_pid
    finally:
        for process in (dead, restarted):
            if process is not None:
                process.kill()
                process.wait()
    wait_until(lambda: w2_pid() is None, 20, "w2 to be gone", stack.broker.log)
    stack.healthy()
