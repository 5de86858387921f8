"""Hostile peers for real daemons: many slow, idle or sudden connections, and the process figures to judge them by.

The tests of slow and many connections (tests/gateway/test_slow_clients.py,
tests/broker/test_many_connections.py) and their benchmark
(``python -m scripts.benchmarks.studies.slow_clients``) share these, so the numbers
and the checks come from the same peers:

* :class:`SlowHttp`: connections that send a request's first bytes at once
  and the rest a byte at a time, from an asyncio loop in a thread, and keep
  ``count`` of them open if asked;
* :func:`burst`: many new connections at once, each with a whole request;
* :class:`IdleZmq`: ZeroMQ connections that never send anything;
* the figures: a process's memory, CPU time, open files and file limit, and a
  listening port's backlog, all read from Linux's /proc and ``ss``.

Opening thousands of connections takes file descriptors in this process too:
:func:`raise_open_files` first.  :func:`open_file_limit` lowers the soft
limit for the daemons started inside it, as systemd's default would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import zmq

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SYSTEMD_DEFAULT_FILES = 1024  # the soft limit systemd gives a unit that sets no LimitNOFILE=


def raise_open_files(wanted: int) -> None:
    """Raise this process's soft limit on open files to ``wanted`` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


@contextlib.contextmanager
def open_file_limit(soft: int = SYSTEMD_DEFAULT_FILES) -> Iterator[None]:
    """This process's soft limit on open files lowered to ``soft``, so the processes started inside inherit it."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


@dataclass(frozen=True)
class Ending:
    """How a hostile connection ended: what the server sent first, and whether it reset the connection."""

    answer: bytes
    reset: bool

    @property
    def status(self) -> int | None:
        """The status of the server's answer, if it sent one."""
        match = re.match(rb"HTTP/1\.[01] (\d{3}) ", self.answer)
        return int(match.group(1)) if match else None


class _Peer(asyncio.Protocol):
    def __init__(self, owner: SlowHttp) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self.sent = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.owner.opened += 1
        self.owner._peers.add(self)  # here, not once connected: the server may answer and close first
        self.transport.write(self.owner.opening)

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.owner.ended(self, exc is not None)

    def trickle(self, data: bytes) -> None:
        if self.transport is not None and self.sent < len(data):
            self.transport.write(data[self.sent:self.sent + 1])
            self.sent += 1


@dataclass
class SlowHttp:
    """``count`` connections to ``port``, each sending ``opening`` at once, then ``trickle`` a byte per ``interval_s``.

    With ``reconnect``, a connection the server closes is replaced at the next
    tick, so ``count`` stay open while the attack lasts.  A connection the
    kernel could not make counts as refused: refused outright, or its SYN
    unanswered after ``syn_retries`` retries (the kernel's own backoff, 1 s
    doubling: 15 s for 3).  The kernel decides, not a timer of this process, so
    a busy host that runs this loop late cannot turn a connection made into a
    refused one (a timeout around the connect once did, and counted such a
    connection both opened and refused).  A ``with`` block runs it; it returns
    once the first ``count`` connections were tried.
    """

    port: int
    count: int
    opening: bytes
    trickle: bytes = b""
    interval_s: float = 1.0
    reconnect: bool = False
    host: str = "127.0.0.1"
    syn_retries: int = 3
    opened: int = 0
    refused: int = 0  # connections that could not be made
    endings: list[Ending] = field(default_factory=list)  # connections the server ended, in order
    _peers: set[_Peer] = field(default_factory=set)
    _connecting: set[asyncio.Task[None]] = field(default_factory=set)
    _started: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    def __enter__(self) -> SlowHttp:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        if not self._started.wait(120):
            raise TimeoutError(f"could not even try {self.count} connections to port {self.port} in 120 s")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close every connection still open (the server's view: a reset) and end the loop."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the hostile peers did not stop"

    def open(self) -> int:
        """Connections open now."""
        return len(self._peers)

    def ended(self, peer: _Peer, reset: bool) -> None:
        if peer in self._peers:
            self._peers.discard(peer)
            self.endings.append(Ending(bytes(peer.received), reset))

    async def _connect(self) -> None:
        assert self._loop is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, self.syn_retries)
        try:
            await self._loop.sock_connect(sock, (self.host, self.port))
        except BaseException as exc:
            sock.close()
            if not isinstance(exc, OSError):
                raise
            self.refused += 1
            return
        await self._loop.create_connection(lambda: _Peer(self), sock=sock)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await asyncio.gather(*(self._connect() for _ in range(self.count)))
        finally:
            self._started.set()
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            for peer in list(self._peers):
                peer.trickle(self.trickle)
            if self.reconnect and not self._stop.is_set():
                for _ in range(self.count - len(self._peers) - len(self._connecting)):
                    task = asyncio.create_task(self._connect())
                    self._connecting.add(task)
                    task.add_done_callback(self._connecting.discard)
        for task in list(self._connecting):
            task.cancel()
        for peer in list(self._peers):
            self._peers.discard(peer)
            if peer.transport is not None:
                peer.transport.abort()


def slow_headers(port: int, count: int, *, reconnect: bool = False) -> SlowHttp:
    """Connections that send a request's headers a byte a second, and never finish them (slowloris)."""
    headers = b"POST /models/m HTTP/1.1\r\nHost: zbatch\r\nX-Slow: " + b"s" * 4096
    return SlowHttp(port, count, headers[:1], headers[1:], reconnect=reconnect)


def slow_bodies(port: int, count: int, *, reconnect: bool = False) -> SlowHttp:
    """Connections that send a request's headers at once, then its body a byte a second."""
    body = b'{"inputs": "' + b"s" * 4096 + b'"}'
    headers = (b"POST /models/m HTTP/1.1\r\nHost: zbatch\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body))
    return SlowHttp(port, count, headers, body, reconnect=reconnect)


def idle_connections(port: int, count: int, *, reconnect: bool = False) -> SlowHttp:
    """Connections that send nothing at all."""
    return SlowHttp(port, count, b"", reconnect=reconnect)


@dataclass(frozen=True)
class Exchange:
    """One connection of a burst: the status of its answer (None: no answer), or why it failed, and how long."""

    status: int | None
    error: str
    seconds: float


def burst(port: int, count: int, request: bytes, *, host: str = "127.0.0.1", timeout_s: float = 60.0
          ) -> list[Exchange]:
    """``count`` new connections started in one tight loop, each then sending ``request`` (which should ask
    to close) and reading the answer.

    The connections start as close together as the system calls allow, as from many clients at once.
    """

    async def finish(sock: socket.socket, started: float, pending: bool) -> Exchange:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                if pending:  # wait until the connection is made, or fails
                    writable = loop.create_future()
                    loop.add_writer(sock, writable.set_result, None)
                    try:
                        await writable
                    finally:
                        loop.remove_writer(sock)
                    if error := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        raise OSError(error, os.strerror(error))
                reader, writer = await asyncio.open_connection(sock=sock)
                writer.write(request)
                answer = await reader.read()
                writer.close()
        except (OSError, TimeoutError) as exc:
            sock.close()
            return Exchange(None, type(exc).__name__, time.monotonic() - started)
        status = Ending(answer, False).status
        return Exchange(status, "" if answer else "no answer", time.monotonic() - started)

    async def all_at_once() -> list[Exchange]:
        sockets = [socket.socket() for _ in range(count)]
        started: list[tuple[socket.socket, float, bool]] = []
        for sock in sockets:
            sock.setblocking(False)
            started.append((sock, time.monotonic(), sock.connect_ex((host, port)) != 0))
        return list(await asyncio.gather(*(finish(*one) for one in started)))

    return asyncio.run(all_at_once())


def http_request(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    """A whole HTTP/1.1 POST that asks the server to close the connection after its answer."""
    return (f"POST {path} HTTP/1.1\r\nHost: zbatch\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class IdleZmq:
    """``count`` ZeroMQ DEALER sockets connected to ``endpoint`` that never send anything."""

    def __init__(self, endpoint: str, count: int) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.context.set(zmq.MAX_SOCKETS, count + 64)
        self.sockets = []
        for _ in range(count):
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            self.sockets.append(sock)

    def __enter__(self) -> IdleZmq:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.context.destroy(linger=0)


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for process {pid}")


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: index i is field i + 3 of stat(5)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has used, user and system."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime: fields 14 and 15 of stat(5)


def minor_faults(pid: int) -> int:
    """How many pages process ``pid`` has faulted in without reading from disk (minflt, field 10 of stat(5))."""
    return int(_stat_fields(pid)[7])


def open_files(pid: int) -> int:
    """How many file descriptors process ``pid`` holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def file_limit(pid: int) -> tuple[int, int]:
    """The soft and hard limits on open files of process ``pid``."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise ValueError(f"no open-file limit for process {pid}")


def listen_overflows() -> int:
    """How many times, machine-wide, a full listen queue made the kernel drop a new connection (it retries later)."""
    lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines() if line.startswith("TcpExt:")]
    names, numbers = lines[0], lines[1]
    return int(numbers[names.index("ListenOverflows")])


def listen_backlog(port: int) -> int:
    """The backlog the kernel gives the socket listening on TCP ``port`` (``ss`` shows it as Send-Q)."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])
