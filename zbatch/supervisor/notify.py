"""The receiving end of systemd's notification protocol, so a supervisor hears its children as systemd would.

Every zbatch daemon already speaks ``sd_notify`` (:mod:`zbatch.runtime.sdnotify`):
READY=1 once it serves (a worker: model loaded and registered with its
broker), WATCHDOG=1 while its event loop turns and its essential tasks live,
STATUS=... for ``systemctl status``.  A supervisor that hands its children a
``$NOTIFY_SOCKET`` of its own learns all of that without any other channel,
and the same daemons run unchanged under systemd or under the supervisor.

Like systemd, the listener asks the kernel for each datagram's sender
(``SO_PASSCRED``), so a message counts for the process that sent it, whatever
it claims.  That is Linux; elsewhere :func:`open_listener` returns None and the
supervisor counts a child ready as soon as it runs.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import struct
from collections.abc import Callable

CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_DATAGRAM = 4096

Handler = Callable[[int, dict[str, str]], None]  # (sender's pid, KEY=value fields)


class Listener:
    """A datagram socket in the abstract namespace; calls ``handler(pid, fields)`` for each message."""

    def __init__(self, sock: socket.socket, name: str, handler: Handler) -> None:
        self._sock = sock
        self.address = "@" + name  # the value of NOTIFY_SOCKET for the children
        self._handler = handler
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._read)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    def _read(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self._sock.recvmsg(MAX_DATAGRAM, socket.CMSG_SPACE(CREDENTIALS.size))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            pid = sender_pid(ancillary)
            if pid is not None:
                self._handler(pid, parse(data))


def open_listener(handler: Handler) -> Listener | None:
    """A fresh listener for one supervisor, or None where the kernel cannot name a datagram's sender."""
    passcred = getattr(socket, "SO_PASSCRED", None)
    if passcred is None or not hasattr(socket, "AF_UNIX"):
        return None
    name = f"zbatch-supervisor-{os.getpid()}-{secrets.token_hex(6)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        sock.setsockopt(socket.SOL_SOCKET, passcred, 1)
        sock.bind("\0" + name)
    except OSError:
        sock.close()
        raise
    return Listener(sock, name, handler)


def sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The pid in an SCM_CREDENTIALS message, if the datagram carries one."""
    credentials = getattr(socket, "SCM_CREDENTIALS", None)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == credentials and len(data) >= CREDENTIALS.size:
            pid, _, _ = CREDENTIALS.unpack_from(data)
            return int(pid)
    return None


def parse(data: bytes) -> dict[str, str]:
    """``READY=1\\nSTATUS=serving`` -> ``{"READY": "1", "STATUS": "serving"}``; lines without ``=`` are skipped."""
    fields = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    return fields
