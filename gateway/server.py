"""Run the gateway until SIGTERM or SIGINT, then drain in stages so no accepted request is cut."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewayConfig
from zbatch.client import AsyncClient
from zbatch.runtime.curve import client_keys
from zbatch.runtime.sdnotify import Notifier

log = logging.getLogger("zbatch.gateway")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def serve(config: GatewayConfig, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until a stop signal; ``ready`` gets the bound port once connections are accepted.

    Shutdown: stop listening, let requests in flight finish (bounded by the
    request timeout), then close the broker client.
    """
    curve = client_keys(config.curve_server_key_file, config.curve_secret_key_file)
    async with AsyncClient(config.frontend, timeout_ms=config.timeout_ms, curve=curve) as client:
        # The slowest accepted request waits its timeout plus the client's grace
        # for the broker's deadline answer; draining that long lets all finish.
        drain_s = (client.timeout_ms + client.reply_grace_ms) / 1000
        # handler_cancellation: a caller who hangs up cancels its handler, and
        # AsyncClient then tells the broker to skip the work.
        # access_log=None: the app writes its own access line, with the request id (gateway/tracing.py).
        runner = web.AppRunner(
            create_app(config, client),
            handler_cancellation=True,
            shutdown_timeout=drain_s,
            access_log=None,
        )
        await runner.setup()
        notifier = Notifier(lambda: f"listening on {config.host}:{config.port}, broker {config.frontend}")
        # Pings systemd's watchdog through the drain too: draining may take longer than WatchdogSec.
        keep_alive = asyncio.get_running_loop().create_task(notifier.keep_alive())
        try:
            site = web.TCPSite(runner, config.host, config.port)
            await site.start()
            port: int = runner.addresses[0][1]
            log.info("zbatch-gateway listening on %s", _url(config.host, port))
            if ready is not None:
                ready(port)
            notifier.ready()
            stop_signal = await _stop_requested()
            notifier.stopping()
            log.info(
                "%s: no longer accepting connections; waiting up to %.1f s for requests in flight",
                stop_signal.name,
                drain_s,
            )
            await site.stop()
        finally:
            keep_alive.cancel()
            await runner.cleanup()
            _restore_signals()
    log.info("zbatch-gateway stopped")


async def _stop_requested() -> signal.Signals:
    """Wait for SIGTERM or SIGINT; later ones are only logged, so the drain runs to its end."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if received.done():
            log.info("%s: already stopping", sig.name)
        else:
            received.set_result(sig)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    return await received


def _restore_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.remove_signal_handler(sig)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
