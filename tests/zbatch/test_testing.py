"""The test harness's own rules (zbatch/testing.py), where a mistake would show only as a rare flaky start."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from zbatch import testing


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
