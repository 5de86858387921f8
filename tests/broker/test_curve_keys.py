"""CURVE keys as identities: what libzmq's ZAP request really carries, named allow-lists, the
rate-limited refusal log, and a worker's name under CURVE."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import struct
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from broker.curve import CurveServer, RefusalLog, read_named_keys
from broker.keyguard import WorkerKeyGuard
from worker.config import load_config as load_worker_config
from zbatch.runtime.curve import WORKERS_DOMAIN, CurveKeys, key_name
from zbatch.runtime.sockets import open_socket
from zbatch.tools.keys import make_key_pair


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    for name in ("broker", "w0", "w1"):
        make_key_pair(tmp_path, name)
    (tmp_path / "workers").mkdir()
    for name in ("w0", "w1"):
        shutil.copy(tmp_path / f"{name}.key", tmp_path / "workers")
    return tmp_path


@pytest.mark.parametrize("broker_routing_id", [b"", b"the-broker"])
def test_zap_sees_the_brokers_routing_id_not_the_peers_and_messages_carry_the_key_name(
    keys: Path, broker_routing_id: bytes
) -> None:
    """The fact the design rests on (libzmq zap_client.cpp; zeromq/libzmq#4161): the ZAP request's
    "identity" frame is the *binding* socket's own routing id, so a ZAP handler cannot check the
    peer's.  The User-Id the handler answers is then on every message of the connection."""

    async def exchange() -> tuple[list[bytes], bytes, str]:
        context = zmq.asyncio.Context()
        server = CurveServer(context, str(keys / "broker.key_secret"), {WORKERS_DOMAIN: str(keys / "workers")})
        identities: list[bytes] = []
        handle = server.authenticator.handle_zap_message

        async def spy(msg: list[bytes]) -> None:
            identities.append(msg[4])
            await handle(msg)

        server.authenticator.handle_zap_message = spy  # type: ignore[method-assign]
        router = open_socket(context, zmq.ROUTER, bind="tcp://127.0.0.1:*", routing_id=broker_routing_id or None,
                             curve=(server, WORKERS_DOMAIN))
        peer_context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        dealer = open_socket(peer_context, zmq.DEALER, connect=str(router.getsockopt_string(zmq.LAST_ENDPOINT)),
                             routing_id=b"w0", curve=CurveKeys.from_files(str(keys / "broker.key"),
                                                                           str(keys / "w0.key_secret")))
        try:
            dealer.send_multipart([b"hello"])
            for _ in range(200):  # the ZAP handler runs on this loop: wait without blocking it
                if router.poll(0):
                    break
                await asyncio.sleep(0.05)
            frames = router.recv_multipart(copy=False)
            return [frame.bytes for frame in frames], identities[0], str(frames[0].get("User-Id"))
        finally:
            dealer.close(linger=0)
            peer_context.term()
            router.close(linger=0)
            server.stop()
            context.term()

    frames, identity, user_id = asyncio.run(exchange())
    assert frames == [b"w0", b"hello"]
    assert identity == broker_routing_id != b"w0"
    assert user_id == "w0"


def test_named_keys_leave_out_what_cannot_name_one_peer(keys: Path, caplog: pytest.LogCaptureFixture) -> None:
    workers = keys / "workers"
    shutil.copy(keys / "w0.key", workers / "w0-copy.key")  # one key under two names: neither
    (workers / "broken.key").write_text("not a certificate\n")
    shutil.copy(keys / "broker.key", workers / "notes.txt")  # not a .key file: not read
    with caplog.at_level(logging.WARNING):
        names = read_named_keys(str(workers))
    assert sorted(names.values()) == ["w1"]
    assert "is also w0.key" in caplog.text or "is also w0-copy.key" in caplog.text
    assert "broken.key" in caplog.text


def test_key_names() -> None:
    assert key_name("/etc/zbatch/keys/host-gpu0.key_secret") == "host-gpu0"
    assert key_name("workers/host-gpu0.key") == "host-gpu0"
    assert key_name("plain") == "plain"


def test_refusals_are_rate_limited_per_subject_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            refusals.warn("routing id w1", "refused w1")
        refusals.warn("routing id w2", "refused w2")  # another subject is not drowned by the flood
        now[0] += 1.0
        refusals.warn("routing id w1", "refused w1")
    lines = [record.getMessage() for record in caplog.records]
    assert lines[:RefusalLog.SUBJECT_BURST] == ["refused w1"] * RefusalLog.SUBJECT_BURST
    assert "refused w2" in lines
    assert lines[-1] == f"refused w1 (and {100 - RefusalLog.SUBJECT_BURST} more like it not logged)"
    assert refusals.total == 102


def test_a_worker_under_curve_is_named_after_its_key(keys: Path, capsys: pytest.CaptureFixture[str]) -> None:
    curve = ["--curve-server-key-file", str(keys / "broker.key"),
             "--curve-secret-key-file", str(keys / "w0.key_secret")]
    assert load_worker_config(curve, {}).identity == "w0"
    assert load_worker_config([*curve, "--name", "w0"], {}).identity == "w0"
    with pytest.raises(SystemExit) as exit_info:
        load_worker_config([*curve, "--name", "gpu7"], {})
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "name 'gpu7' is not the name of this worker's CURVE key 'w0'" in error and error.count("\n") == 1
    assert load_worker_config(["--name", "gpu7"], {}).identity == "gpu7"  # without CURVE, any name


def monitor_event(event: int, descriptor: int) -> list[bytes]:
    """A socket monitor message as libzmq sends it: event and value, then the endpoint."""
    return [struct.pack("=hi", event, descriptor), b"tcp://127.0.0.1:5556"]


def test_the_guard_cuts_a_connection_that_shows_nothing_in_time_and_only_that_one() -> None:
    now = [0.0]
    guard = WorkerKeyGuard(RefusalLog(clock=lambda: now[0]), grace_s=1.0, clock=lambda: now[0])
    watched, peer = socket.socketpair()
    reused, reused_peer = socket.socketpair()
    try:
        guard.on_monitor_event(monitor_event(zmq.EVENT_ACCEPTED, watched.fileno()))
        assert guard.expire() == 1.0
        now[0] = 1.5
        assert guard.expire() is None and guard.cut == 1
        assert peer.recv(1) == b""  # shut down: the peer sees the end of the stream
        # A descriptor that was closed and reused by the time the deadline came is someone else's.
        guard.on_monitor_event(monitor_event(zmq.EVENT_ACCEPTED, reused.fileno()))
        number = reused.fileno()
        reused.close()
        stranger, stranger_peer = socket.socketpair()
        assert number in (stranger.fileno(), stranger_peer.fileno())
        now[0] = 3.0
        assert guard.expire() is None and guard.cut == 1
        stranger.setblocking(False)
        stranger_peer.setblocking(False)
        stranger.send(b"x")
        assert stranger_peer.recv(1) == b"x"
        stranger.close()
        stranger_peer.close()
        # A connection that is gone is forgotten.
        guard.on_monitor_event(monitor_event(zmq.EVENT_ACCEPTED, peer.fileno()))
        guard.on_monitor_event(monitor_event(zmq.EVENT_DISCONNECTED, peer.fileno()))
        assert guard.expire() is None
    finally:
        for sock in (watched, peer, reused_peer):
            sock.close()
