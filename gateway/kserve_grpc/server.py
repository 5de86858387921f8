"""The gRPC server of one gateway process: grpc.aio on the process's event loop, beside the HTTP listener.

Its options are the gateway's limits in gRPC's terms: a message may be
``max_body_bytes`` (a larger one is refused by gRPC itself,
``RESOURCE_EXHAUSTED``); at most ``max_open_connections`` calls are open at
once, every connection together (the next is refused, ``RESOURCE_EXHAUSTED``),
as the HTTP listener caps its connections; a connection idle for
``idle_timeout_ms`` is closed.  With ``reuse_port`` (the processes of
``--processes``) every process binds the port with ``SO_REUSEPORT`` and the
kernel spreads connections over them, as it does HTTP's.

Start binds and serves (a port that cannot be bound fails the start); drain
refuses new calls (``UNAVAILABLE``) and lets those in flight finish, within
the drain time.
"""

from __future__ import annotations

import grpc

from gateway.config import GatewayConfig
from gateway.kserve_grpc.service import Gateway, Service


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """The KServe v2 service on ``config.grpc_port``."""

    def __init__(self, config: GatewayConfig, gateway: Gateway) -> None:
        self.config = config
        self._server = grpc.aio.server(
            handlers=(Service(gateway).handlers(),),
            maximum_concurrent_rpcs=config.max_open_connections,
            options=(("grpc.so_reuseport", 1 if config.reuse_port else 0),
                     ("grpc.max_receive_message_length", config.max_body_bytes),
                     ("grpc.max_connection_idle_ms", config.idle_timeout_ms)))
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the port.  Raises RuntimeError if the port cannot be bound."""
        self.port = self._server.add_insecure_port(address(self.config.host, self.config.grpc_port))
        await self._server.start()
        return self.port

    async def wait_closed(self) -> None:
        await self._server.wait_for_termination()

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls and give those in flight ``grace_s`` to finish; then cancel what is left."""
        await self._server.stop(grace_s)
