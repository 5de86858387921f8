"""The gateway as a daemon: the aiohttp app on its port, a broker client, and a drain that cuts no request.

The lifecycle is :mod:`zbatch.runtime.daemon`'s.  Start: open the client,
set the app up and listen; the HTTP listener is essential.  Drain: stop
listening, then let the requests in flight finish, for at most the request
timeout plus the client's grace for the broker's deadline answer (the
longest an accepted request can take).  Close: the broker client.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewayConfig
from zbatch.client import AsyncClient
from zbatch.runtime import daemon
from zbatch.runtime.curve import client_keys

log = logging.getLogger("zbatch.gateway")


class GatewayServer(daemon.Service):
    name = "zbatch-gateway"
    log = log

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._client: AsyncClient | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._drain_s = 0.0

    async def start(self) -> daemon.Essentials:
        config = self.config
        curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
        self._client = client = AsyncClient(config.frontend, timeout_ms=config.timeout_ms, curve=curve)
        self._drain_s = (client.timeout_ms + client.reply_grace_ms) / 1000
        # handler_cancellation: a caller who hangs up cancels its handler, and
        # AsyncClient then tells the broker to skip the work.
        # access_log=None: the app writes its own access line, with the request id (gateway/tracing.py).
        self._runner = web.AppRunner(create_app(config, client), handler_cancellation=True,
                                     shutdown_timeout=self._drain_s, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, config.host, config.port)
        await self._site.start()
        log.info("zbatch-gateway listening on %s", _url(config.host, self._runner.addresses[0][1]))
        listener = self._site._server  # the asyncio server: aiohttp keeps it there, and has no accessor
        assert listener is not None
        return {"the HTTP listener": asyncio.ensure_future(listener.wait_closed())}

    def status_line(self) -> str:
        return f"listening on {self.config.host}:{self.config.port}, broker {self.config.frontend}"

    async def drain(self) -> None:
        assert self._site is not None and self._runner is not None
        log.info("no longer accepting connections; waiting up to %.1f s for requests in flight", self._drain_s)
        await self._site.stop()
        await self._cleanup_runner()

    async def close(self) -> None:
        await self._cleanup_runner()
        if self._client is not None:
            await self._client.close()

    async def _cleanup_runner(self) -> None:
        """Stop listening if it still does, wait for the requests in flight (within the drain), clean the app up."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
