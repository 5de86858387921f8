"""The test harness's own rules (zbatch/testing.py), where a mistake would show only as a rare flaky start."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zmq

from zbatch import testing
from zbatch.protocol import wire
from zbatch.protocol.messages import Reply
from zbatch.protocol.payloads import encode_payload
from zbatch.protocol.wire import Status
from zbatch.testing import Daemons


class RepeatingKernel:
    """A fake socket: the kernel handing out a port it has just handed out, as it may once that socket is
    closed (seen in CI: a broker's frontend and backend on one port).  Ports come from ``ports`` in turn."""

    def __init__(self, ports: list[int]) -> None:
        self._ports = ports

    def __call__(self, *_: Any) -> RepeatingKernel:
        return self

    def __enter__(self) -> RepeatingKernel:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def bind(self, _: object) -> None:
        return None

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self._ports.pop(0)


def test_free_port_never_gives_a_port_twice_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing, "_GIVEN", {})
    monkeypatch.setattr("zbatch.testing.socket.socket", RepeatingKernel([40001, 40001, 40001, 40002, 40001, 40003]))
    assert [testing.free_port() for _ in range(3)] == [40001, 40002, 40003]


def test_free_port_forgets_the_oldest_ports_past_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testing, "_GIVEN", {})
    monkeypatch.setattr(testing, "RECENT_PORTS", 2)
    monkeypatch.setattr("zbatch.testing.socket.socket", RepeatingKernel([40001, 40002, 40003, 40001]))
    assert [testing.free_port() for _ in range(4)] == [40001, 40002, 40003, 40001]


def test_free_ports_are_real_and_distinct() -> None:
    ports = [testing.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # nothing holds it


class RacedStarts:
    """A fake start: its first ``raced`` daemons fail as a daemon does whose free port another process took
    before it bound it (a race between processes, which no test can make happen on purpose)."""

    def __init__(self, raced: int, message: str = "cannot bind tcp://127.0.0.1:46081: Address already in use") -> None:
        self.raced, self.message, self.calls = raced, message, 0

    def __call__(self) -> testing.Daemon:
        self.calls += 1
        if self.calls <= self.raced:
            raise testing.DaemonFailure(f"broker exited with code 1\n{self.message}")
        return testing.Daemon("broker", None, None)  # type: ignore[arg-type]  # never used: only counted


def test_a_daemon_whose_chosen_ports_were_taken_starts_again_on_fresh_ones() -> None:
    starts = RacedStarts(raced=2)
    assert testing._on_free_ports(starts, chosen=True).name == "broker" and starts.calls == 3


@pytest.mark.parametrize(("starts", "chosen"), [
    (RacedStarts(raced=5), True),  # it gives up after its tries
    (RacedStarts(raced=1), False),  # a port the caller gave: the test meant it
    (RacedStarts(raced=1, message="ValueError: no model"), True),  # any other failure
])
def test_other_start_failures_fail_at_once(starts: RacedStarts, chosen: bool) -> None:
    with pytest.raises(testing.DaemonFailure):
        testing._on_free_ports(starts, chosen=chosen)
    assert starts.calls == (3 if starts.raced == 5 else 1)


def test_broker_stats_reads_only_its_own_answer_and_merges_the_brokers_that_answer(tmp_path: Path) -> None:
    """The harness's one-shot STATS probe: a peer that first sends a heartbeat, an answer to another query and
    an unreadable message is read past; an endpoint where nothing listens leaves the others' merged view, and
    alone gives None once its time is up."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(testing.broker_stats, f"tcp://127.0.0.1:{port}", 10_000)
            dealer, *query = router.recv_multipart()
            query_id = query[1]
            ours = {"workers": [{"name": "w"}], "models": {}}
            for frames in (wire.encode_heartbeat(), [b"\xff", b"not a message"],
                           wire.encode_reply(Reply(b"someone-else", Status.OK, payload=encode_payload({}))),
                           wire.encode_reply(Reply(query_id, Status.OK, payload=encode_payload(ours)))):
                router.send_multipart([dealer, *frames])
            assert asked.result(timeout=10) == ours
        with Daemons(tmp_path) as daemons:
            broker = daemons.add(testing.start_broker(tmp_path))
            nobody = f"tcp://127.0.0.1:{testing.free_port()}"
            merged = testing.broker_stats(f"{broker.frontend},{nobody}", timeout_ms=300)
            assert merged is not None and "uptime_s" in merged["brokers"][broker.frontend]
            assert merged["brokers"][nobody] == {"error": f"{nobody} gave no statistics"}
            assert testing.broker_stats(nobody, timeout_ms=300) is None
    finally:
        router.close(linger=0)
        context.term()
