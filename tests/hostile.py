"""Hostile peers for real daemons, and what the tests watch while they attack.

HOSTILE PEERS, not fakes of zbatch: raw ZeroMQ sockets that speak the wire
protocol the way an attacker or a broken implementation would (a worker
that lies about its capacity and never answers, clients that never read,
floods of registrations).  ``NormalTraffic`` is the honest client whose
every request must still be answered meanwhile.  ``scripts/benchmarks/studies/hostile.py``
measures the same attacks for the record.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from zbatch.client import AsyncClient, ZBatchError
from zbatch.protocol import wire
from zbatch.protocol.wire import BatchCounters, Heartbeat, ModelInfo, Ready, Reply, Request, Status

Context = zmq.Context[zmq.Socket[bytes]]


def rss_bytes(pid: int) -> int:
    """The resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


class PeakRss:
    """Samples a process's RSS every few milliseconds until stopped; ``peak`` is the largest seen."""

    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, ValueError):
                return


class HostileWorker:
    """A backend peer that registers as it pleases, heartbeats so it is never expired, and never answers."""

    def __init__(self, context: Context, backend: str, identity: bytes) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, identity)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 1_000_000)
        self.socket.connect(backend)
        self.received = 0  # requests
        self.job_ids: list[bytes] = []  # of the requests received, in order
        self.silent = False  # True: keeps its connection but sends nothing more, as a host that froze
        self._heartbeat = wire.encode_heartbeat()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._keep_alive, daemon=True)

    def ready(self, models: list[str], capacity: int) -> None:
        ready = wire.encode_ready(Ready(tuple(ModelInfo(m, "embeddings", 1) for m in models), 1))
        # Write the capacity into the frame by hand: the encoder is honest, a hostile peer need not be.
        ready[1] = ready[1].replace(b"\xa8capacity\x01", b"\xa8capacity" + _msgpack_uint(capacity))
        self.send(ready)

    def heartbeat(self, counters: dict[str, BatchCounters] | None = None) -> None:
        self.send(wire.encode_heartbeat(Heartbeat(counters or {})))

    def send(self, frames: list[bytes]) -> None:
        with self._lock:
            self.socket.send_multipart(frames)

    def reply(self, job_id: bytes, status: Status, message: str = "") -> None:
        self.send(wire.encode_reply(Reply(job_id, status, message)))

    def start(self) -> HostileWorker:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.socket.close(linger=0)

    def _keep_alive(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                while self.socket.poll(0):
                    frames = self.socket.recv_multipart()  # requests and heartbeats: read, never answered
                    if frames[0] == wire.HEADERS[wire.Command.REQUEST]:
                        self.received += 1
                        self.job_ids.append(frames[1])
                if not self.silent:
                    self.socket.send_multipart(self._heartbeat)


def _msgpack_uint(value: int) -> bytes:
    """The msgpack encoding of a non-negative integer (uint64 at most), written without msgpack's checks."""
    if value < 128:
        return bytes((value,))
    for marker, size in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
        if value < 1 << (8 * size):
            return bytes((marker,)) + value.to_bytes(size, "big")
    raise ValueError("too large for msgpack")


BLAST_WINDOW = 1_000  # requests a blast keeps unanswered at most: a quarter of what a broker holds for a connection


def blast(context: Context, frontend: str, model: str, payload: bytes, count: int, timeout_ms: int,
          wait_s: float, window: int = BLAST_WINDOW) -> Counter[str]:
    """``count`` requests of ``payload`` on one connection, as fast as it can send them, reading the answers
    as they come; the statuses of the answers within ``wait_s``.

    At most ``window`` requests are unanswered at a time: a broker holds a bounded number of unanswered
    requests and unread answers for one connection (``max_client_requests``, 4,096 by default), and a
    client that the host slows down more than the broker must not pass it, or what it counts depends on
    the host's pace rather than on the broker."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, count + 1)
    socket.connect(frontend)
    statuses: Counter[str] = Counter()

    def read(timeout_ms: int) -> None:
        while socket.poll(timeout_ms):
            statuses[wire.decode_reply(socket.recv_multipart()).status.value] += 1
            timeout_ms = 0

    try:
        for number in range(count):
            while number - sum(statuses.values()) >= window:
                read(100)
            socket.send_multipart(wire.encode_request(Request(b"blast-%d" % number, model, 1, payload, timeout_ms)))
            read(0)
        deadline = time.monotonic() + wait_s
        while sum(statuses.values()) < count and time.monotonic() < deadline:
            read(100)
        return statuses
    finally:
        socket.close(linger=0)


def never_read(context: Context, frontend: str, messages: int) -> zmq.Socket[bytes]:
    """A client that sends ``messages`` STATS queries and never reads an answer; close it when done."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, messages + 1)
    socket.setsockopt(zmq.RCVHWM, 1)
    socket.connect(frontend)
    for number in range(messages):
        socket.send_multipart(wire.encode_stats_query(b"q%d" % number))
    return socket


@dataclass
class NormalTraffic:
    """Closed-loop honest clients of ``model`` on the broker, in a thread; every request is accounted for."""

    frontend: str
    model: str
    concurrency: int = 4
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> NormalTraffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "normal traffic did not finish: a request hung"

    @property
    def answered(self) -> int:
        return len(self.latencies) + sum(self.failures.values())

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        p50 = ordered[len(ordered) // 2] * 1000 if ordered else None
        p99 = ordered[int(len(ordered) * 0.99)] * 1000 if ordered else None
        return {"sent": self.sent, "ok": len(self.latencies), "failures": dict(self.failures),
                "p50_ms": p50, "p99_ms": p99}

    async def _run(self) -> None:
        async with AsyncClient(self.frontend, fail_fast_overload=False, timeout_ms=20_000) as client:
            await asyncio.gather(*(self._one(client, n) for n in range(self.concurrency)))

    async def _one(self, client: AsyncClient, number: int) -> None:
        while not self._stop.is_set():
            self.sent += 1
            started = time.perf_counter()
            try:
                await client.infer(self.model, [f"normal traffic from client {number}"])
            except ZBatchError as exc:
                self.failures[type(exc).__name__] += 1
                await asyncio.sleep(0.01)
            else:
                self.latencies.append(time.perf_counter() - started)
