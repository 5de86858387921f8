"""FAKE daemons for the supervisor's tests: the real daemon lifecycle around a service that does nothing.

``python -m tests.fake_daemon serve --drain-s 0.5`` runs :func:`zbatch.runtime.daemon.serve`
(so READY=1, watchdog pings and the stop rules are the real daemons' own), with a drain that
takes ``--drain-s``; ``--hang-after-ready`` then blocks its event loop, as a hung daemon would.
``crash`` exits 1 at once and ``bad-settings`` exits 2, as a daemon with a bad setting does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from zbatch.runtime import daemon
from zbatch.runtime.logs import setup_logging

log = logging.getLogger("zbatch.fake")


class FakeService(daemon.Service):
    name = "FAKE-daemon"
    log = log

    def __init__(self, drain_s: float, hang: bool) -> None:
        self.drain_s = drain_s
        self.hang = hang
        self._forever: asyncio.Future[None] | None = None

    async def start(self) -> daemon.Essentials:
        self._forever = asyncio.get_running_loop().create_future()
        return {"nothing": self._forever}

    async def ready(self) -> None:
        if self.hang:
            asyncio.get_running_loop().call_later(0.1, time.sleep, 3600)  # READY=1 goes out, then the loop hangs

    def status_line(self) -> str:
        return "FAKE: serving nothing"

    async def drain(self) -> None:
        log.info("FAKE: draining for %.1f s", self.drain_s)
        await asyncio.sleep(self.drain_s)

    async def close(self) -> None:
        if self._forever is not None:
            self._forever.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("serve", "crash", "bad-settings"))
    parser.add_argument("--drain-s", type=float, default=0.0)
    parser.add_argument("--hang-after-ready", action="store_true")
    args = parser.parse_args()
    setup_logging("FAKE-daemon", "info", "text")
    if args.mode == "crash":
        log.error("FAKE: crashing at start")
        sys.exit(1)
    if args.mode == "bad-settings":  # as zbatch.runtime.settings reports one
        print("FAKE-daemon: error: --setting='x': FAKE bad setting", file=sys.stderr)
        sys.exit(2)
    asyncio.run(daemon.serve(FakeService(args.drain_s, args.hang_after_ready)))


if __name__ == "__main__":
    main()
