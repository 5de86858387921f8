"""CURVE on a real broker over real sockets: known keys work, unknown keys, keys of the wrong role
and plaintext peers get nowhere; and the daemons themselves talk over CURVE.

Every refusal is observed, not assumed: the peer's socket monitor reports the failed handshake
(libzmq's ZAP denial or a mechanism mismatch), then the broker's statistics show nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.daemons import Daemon, broker_stats, http_json, start_broker, start_gateway, start_worker, wait_until
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import AsyncClient, BrokerUnavailable
from zbatch.protocol import wire
from zbatch.protocol.wire import ModelInfo, Ready, Reply, Request, Status
from zbatch.runtime.curve import CurveKeys
from zbatch.tools.keys import make_key_pair

MODEL = "m"
HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Keys:
    """Key pairs made with zbatch-keys' code, and the broker's two allow-list folders."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for name in ("broker", "client", "gateway", "worker", "gpu-worker", "stranger"):
            make_key_pair(folder, name)
        self.clients, self.workers = folder / "clients", folder / "workers"
        for allowed, names in ((self.clients, ("client", "gateway")), (self.workers, ("worker", "gpu-worker"))):
            allowed.mkdir()
            for name in names:
                shutil.copy(folder / f"{name}.key", allowed)

    def secret(self, name: str) -> str:
        return str(self.folder / f"{name}.key_secret")

    @property
    def server(self) -> str:
        return str(self.folder / "broker.key")

    def of(self, name: str, server: str = "broker") -> CurveKeys:
        return CurveKeys.from_files(str(self.folder / f"{server}.key"), self.secret(name))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def broker(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_broker(tmp_path_factory.mktemp("curve"), curve=keys.of("client"), models=(MODEL,),
                          heartbeat_liveness=30, curve_secret_key_file=keys.secret("broker"),
                          curve_clients_dir=str(keys.clients), curve_workers_dir=str(keys.workers))
    yield daemon
    daemon.stop()


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def handshake(context: zmq.Context[zmq.Socket[bytes]], endpoint: str, curve: CurveKeys | None,
              identity: bytes = b"") -> tuple[zmq.Socket[bytes], int]:
    """A DEALER connected to ``endpoint`` and how its first handshake ended (a monitor event)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if curve is not None:
        curve.apply(sock)
    monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS)
    sock.connect(endpoint)
    assert monitor.poll(10_000), "no handshake outcome within 10 s"
    event = int(recv_monitor_message(monitor)["event"])
    sock.disable_monitor()
    monitor.close()
    return sock, event


def worker_names(broker: Daemon, keys: Keys) -> list[str]:
    stats = broker_stats(broker.frontend, curve=keys.of("client")) or {"workers": []}
    return [w["name"] for w in stats["workers"]]


def ready(name: str) -> list[bytes]:
    return wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4),), 8, name))


def test_known_worker_registers_and_known_client_is_served(
    broker: Daemon, keys: Keys, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    worker, event = handshake(context, broker.backend, keys.of("worker"), b"worker")  # its key's name
    assert event == zmq.EVENT_HANDSHAKE_SUCCEEDED
    worker.send_multipart(ready("worker"))
    wait_until(lambda: "worker" in worker_names(broker, keys), 10, "the worker to register", broker.log)

    async def ask() -> Reply:
        async with AsyncClient(broker.frontend, curve=keys.of("client")) as client:
            return await client.request(MODEL, b"\x80", items=1, timeout_ms=10_000)

    def answer() -> None:
        """The worker's side: skip heartbeats, answer the one request."""
        while True:
            assert worker.poll(10_000), "no request reached the worker"
            message = wire.decode_broker_to_worker(worker.recv_multipart())
            if isinstance(message, Request):
                break
        worker.send_multipart(wire.encode_reply(Reply(message.request_id, Status.OK, "", b"secret result")))

    async def round_trip() -> Reply:
        reply, _ = await asyncio.gather(ask(), asyncio.to_thread(answer))
        return reply

    reply = asyncio.run(round_trip())
    assert (reply.status, reply.payload) == (Status.OK, b"secret result")
    worker.send_multipart(wire.encode_disconnect("done"))


@pytest.mark.parametrize(("who", "expected"), [
    ("stranger", zmq.EVENT_HANDSHAKE_FAILED_AUTH),  # a key in no allow-list
    ("client", zmq.EVENT_HANDSHAKE_FAILED_AUTH),  # a client's key is not a worker's
    (None, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL),  # plaintext against CURVE
])
def test_a_worker_without_an_allowed_key_cannot_register(
    broker: Daemon, keys: Keys, context: zmq.Context[zmq.Socket[bytes]], who: str | None, expected: int
) -> None:
    name = f"intruder-{who}"
    intruder, event = handshake(context, broker.backend, keys.of(who) if who else None, name.encode())
    assert event & (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL), event
    if who is not None:
        assert event == expected
    with contextlib.suppress(zmq.Again):  # queued at most: no handshake ever completes to carry it
        intruder.send_multipart(ready(name), flags=zmq.NOBLOCK)
    assert name not in worker_names(broker, keys)


@pytest.mark.parametrize("who", ["stranger", "worker", None, "wrong-server"])
def test_a_client_without_an_allowed_key_gets_no_service(
    broker: Daemon, keys: Keys, context: zmq.Context[zmq.Socket[bytes]], who: str | None
) -> None:
    curve = {"stranger": keys.of("stranger"), "worker": keys.of("worker"), None: None,
             "wrong-server": keys.of("client", server="stranger")}[who]
    _, event = handshake(context, broker.frontend, curve)
    assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED

    async def ask() -> None:
        async with AsyncClient(broker.frontend, curve=curve, connect_timeout_ms=300) as client:
            await client.stats(timeout_ms=1000)

    with pytest.raises(BrokerUnavailable):
        asyncio.run(ask())


def test_sighup_rotates_keys_without_a_restart(
    broker: Daemon, keys: Keys, context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    make_key_pair(keys.folder, "next-worker")
    allowed = keys.workers / "next-worker.key"

    def admitted() -> bool:
        sock, event = handshake(context, broker.backend, keys.of("next-worker"))
        sock.close(linger=0)
        return event == zmq.EVENT_HANDSHAKE_SUCCEEDED

    assert not admitted()
    shutil.copy(keys.folder / "next-worker.key", allowed)
    broker.signal(signal.SIGHUP)
    wait_until(admitted, 10, "the added key to be allowed", broker.log)
    allowed.unlink()
    broker.signal(signal.SIGHUP)
    wait_until(lambda: not admitted(), 10, "the removed key to be refused", broker.log)
    assert broker.alive()


def test_settings_must_come_together(keys: Keys, tmp_path: Path) -> None:
    for flags in (["--curve-secret-key-file", keys.secret("broker")],
                  ["--curve-clients-dir", str(keys.clients), "--curve-workers-dir", str(keys.workers)],
                  ["--curve-secret-key-file", keys.server, "--curve-clients-dir", str(keys.clients),
                   "--curve-workers-dir", str(keys.workers)]):
        run = subprocess.run([sys.executable, "-m", "broker", *flags], capture_output=True, text=True, timeout=60,
                             check=False)
        assert run.returncode == 2, run.stderr
        assert run.stderr.count("\n") == 1 and "curve" in run.stderr, run.stderr
    for module in ("worker", "gateway"):
        run = subprocess.run([sys.executable, "-m", module, "--curve-server-key-file", keys.server],
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 2 and "must be set together" in run.stderr, run.stderr


def test_zbatch_keys_writes_a_private_pair_once(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "zbatch.tools.keys", str(tmp_path / "keys"), "gpu0"]
    made = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    public, secret = tmp_path / "keys" / "gpu0.key", tmp_path / "keys" / "gpu0.key_secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert CurveKeys.from_files(str(public), str(secret)).public == zmq.auth.load_certificate(public)[0]
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1 and "exists" in again.stderr


def test_the_daemons_talk_over_curve(broker: Daemon, keys: Keys, tmp_path: Path) -> None:
    """A real worker (the real model) and a real gateway, each with its own key."""
    worker = start_worker(broker, tmp_path, "gpu-worker", curve_server_key_file=keys.server,
                          curve_secret_key_file=keys.secret("gpu-worker"))
    gateway = start_gateway(broker, tmp_path, curve_server_key_file=keys.server,
                            curve_secret_key_file=keys.secret("gateway"))
    try:
        status, _, vector = http_json(f"{gateway.url}/models/{DEFAULT_MODEL_NAME}", {"inputs": "over curve"})
        assert status == 200 and np.asarray(vector).shape == (384,)
        status, _, stats = http_json(f"{gateway.url}/v1/stats")
        assert status == 200 and "gpu-worker" in [w["name"] for w in stats["workers"]]
    finally:
        gateway.stop()
        worker.stop()
