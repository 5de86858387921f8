"""The gateway as a daemon: the aiohttp app on its port, a broker client, and a drain that cuts no request.

The lifecycle is :mod:`zbatch.runtime.daemon`'s.  Start: open the client,
set the app up and listen; the HTTP listener is essential, and so is the
KServe v2 gRPC server with ``grpc_port`` set (gateway/kserve_grpc/, which
shares the app's broker client, catalog, limits and metrics).  Drain: stop
listening (gRPC: refuse new calls), then let the requests in flight finish,
for at most the request timeout plus the client's grace for the broker's
deadline answer (the longest an accepted request can take).  Close: the
broker client.

The listener is the event loop's own server, not an aiohttp site: its
protocol is :class:`gateway.connections.Connection`, which caps the open
connections and holds each request's headers to a deadline, and its listen
backlog is a setting (aiohttp's default, 128, overflows in a burst of new
connections, and the kernel drops what overflows until the clients retry a
second later).  At start the gateway warns when the host would not let the
cap or the backlog take effect.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.app import broker_client, create_app
from gateway.appkeys import IN_FLIGHT
from gateway.catalog import CATALOG
from gateway.config import GatewayConfig
from gateway.connections import Connection
from gateway.guard import ApiKeys, read_api_keys
from gateway.metrics import METRICS
from zbatch.client import AsyncClient

if TYPE_CHECKING:
    from gateway.kserve_grpc.server import GrpcServer
from zbatch.runtime import daemon

log = logging.getLogger("zbatch.gateway")

RESERVED_FILES = 64  # what the gateway opens besides its connections: the broker client, the loop, logs
PROCESS_HEADER = "X-Zbatch-Pid"  # with reuse_port: which of the processes on the port answered
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")  # Linux's cap on any listen backlog


class GatewayServer(daemon.Service):
    name = "zbatch-gateway"
    log = log

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._client: AsyncClient | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._grpc: GrpcServer | None = None
        self._drain_s = 0.0

    async def start(self) -> daemon.Essentials:
        config = self.config
        self._client = client = broker_client(config)
        await client.connect()
        self._drain_s = (client.timeout_ms + client.reply_grace_ms) / 1000
        app = create_app(config, client)
        essentials = await self._start_grpc(app, client) if config.grpc_port else {}
        connections = app[METRICS].connections(config.max_open_connections, config.header_timeout_ms / 1000)
        if config.reuse_port:  # one of several processes on this port: say which one answers
            app.on_response_prepare.append(name_the_process)
        # handler_cancellation: a caller who hangs up cancels its handler, and
        # AsyncClient then tells the broker to skip the work.
        self._runner = runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=self._drain_s)
        await runner.setup()
        server = runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        # access_log=None: the app writes its own access line, with the request id (gateway/tracing.py).
        options = {"loop": loop, "keepalive_timeout": config.idle_timeout_ms / 1000, "access_log": None}
        self._listener = listener = await loop.create_server(
            lambda: Connection(server, connections, **options), config.host, config.port,
            backlog=config.listen_backlog, reuse_port=True if config.reuse_port else None,
        )
        port = listener.sockets[0].getsockname()[1]
        log.info("zbatch-gateway listening on %s", _url(config.host, port))
        warn_of_host_limits(config)
        return {"the HTTP listener": asyncio.ensure_future(listener.wait_closed()), **essentials}

    async def _start_grpc(self, app: web.Application, client: AsyncClient) -> daemon.Essentials:
        """The gRPC server, sharing the app's client, catalog, in-flight count and metrics; serving on return."""
        from gateway.kserve_grpc.server import GrpcServer, address  # grpcio is needed only with a gRPC port
        from gateway.kserve_grpc.service import Gateway

        config = self.config
        keys = ApiKeys(read_api_keys(config.api_keys_file)) if config.api_keys_file else None
        shared = Gateway(config, client, app[CATALOG], app[IN_FLIGHT], app[METRICS], keys)
        self._grpc = grpc = GrpcServer(config, shared)
        port = await grpc.start()
        log.info("zbatch-gateway serving KServe v2 gRPC on %s", address(config.host, port))
        return {"the gRPC server": asyncio.ensure_future(grpc.wait_closed())}

    def status_line(self) -> str:
        grpc = f", gRPC on {self.config.grpc_port}" if self.config.grpc_port else ""
        return f"listening on {self.config.host}:{self.config.port}{grpc}, broker {self.config.frontend}"

    async def drain(self) -> None:
        log.info("no longer accepting connections; waiting up to %.1f s for requests in flight", self._drain_s)
        self._stop_listening()
        await asyncio.gather(self._cleanup_runner(), self._stop_grpc(self._drain_s))

    async def close(self) -> None:
        self._stop_listening()
        await asyncio.gather(self._cleanup_runner(), self._stop_grpc(0))
        if self._client is not None:
            await self._client.close()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()

    async def _stop_grpc(self, grace_s: float) -> None:
        grpc, self._grpc = self._grpc, None
        if grpc is not None:
            await grpc.drain(grace_s)

    async def _cleanup_runner(self) -> None:
        """Close idle connections, wait for the requests in flight (within the drain), clean the app up."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def name_the_process(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Say which process answered, where several share the port (a signal handler of the app)."""
    response.headers[PROCESS_HEADER] = str(os.getpid())


def warn_of_host_limits(config: GatewayConfig) -> None:
    """Warn of a limit of this host that would keep the connection cap or the listen backlog from working."""
    files = daemon.open_file_limit()
    if files is not None and files < config.max_open_connections + RESERVED_FILES:
        log.warning(
            "max_open_connections is %d but the open-file limit is %d: past about %d connections, new ones "
            "cannot be accepted at all; raise the limit (LimitNOFILE= in the unit, ulimit -n) or lower "
            "max_open_connections", config.max_open_connections, files, max(0, files - RESERVED_FILES))
    somaxconn = _read_int(SOMAXCONN)
    if somaxconn is not None and config.listen_backlog > somaxconn:
        log.warning(
            "listen_backlog is %d but the kernel caps it at net.core.somaxconn, %d: raise that "
            "(sysctl -w net.core.somaxconn=%d) or a burst of new connections overflows the queue",
            config.listen_backlog, somaxconn, config.listen_backlog)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
