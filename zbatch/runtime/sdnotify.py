"""systemd's notification protocol (``Type=notify``), written out so the daemons need no dependency.

systemd passes a unix datagram socket in ``$NOTIFY_SOCKET`` (a path, or an
abstract name starting with ``@``); each datagram is ``KEY=value`` lines.
The daemons send ``READY=1`` once they really serve (so ``systemctl start``
and ordering wait for that, not for the fork), ``STOPPING=1`` when they
drain, ``STATUS=...`` for ``systemctl status``, and ``WATCHDOG=1`` at half of
``WatchdogSec`` (``$WATCHDOG_USEC``) so systemd restarts a hung process.
Outside systemd every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable

STATUS_EVERY_S = 5.0


def notify(message: str) -> bool:
    """Send one notification; False when not run by systemd or the socket is gone."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address.startswith(("/", "@")):
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError:
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Seconds between watchdog pings (half the timeout), or None when systemd watches no watchdog."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


class Notifier:
    """READY, STOPPING, and paced STATUS and WATCHDOG messages for one daemon.

    ``tick`` is cheap enough to call on every turn of a daemon's loop: it only
    sends when a ping or a status refresh is due, so the watchdog proves that
    loop is turning.
    """

    def __init__(self, status: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self.watchdog_s = watchdog_interval_s() if self.enabled else None
        self._status = status
        self._clock = clock
        self._next_ping = self._next_status = clock()

    def ready(self) -> None:
        if self.enabled:
            notify(f"READY=1\nSTATUS={self._status()}")

    def status(self, text: str) -> None:
        """A one-off STATUS, such as why the daemon is about to exit."""
        if self.enabled:
            notify(f"STATUS={text}")

    def stopping(self) -> None:
        if self.enabled:
            notify(f"STOPPING=1\nSTATUS={self._status()}")

    def tick(self) -> None:
        if not self.enabled:
            return
        now = self._clock()
        if self.watchdog_s is not None and now >= self._next_ping:
            notify("WATCHDOG=1")
            self._next_ping = now + self.watchdog_s
        if now >= self._next_status:
            notify(f"STATUS={self._status()}")
            self._next_status = now + STATUS_EVERY_S

    async def keep_alive(self, healthy: Callable[[], bool] = lambda: True) -> None:
        """Tick from the event loop until cancelled, skipping every tick while ``healthy()`` is false.

        A ping then says the loop turns and the daemon is whole.  Ticks come at
        half the ping interval: a sleep may end a little early, and a tick that
        just misses its ping must not leave the next one a whole interval late.
        The first tick comes after the first pause, so a daemon that is ready
        at once says READY=1 before anything else.
        """
        if not self.enabled:
            return
        pause_s = min(self.watchdog_s or STATUS_EVERY_S, STATUS_EVERY_S) / 2
        while True:
            await asyncio.sleep(pause_s)
            if healthy():
                self.tick()
