"""``zbatch-gateway --processes N``: N gateway processes on one port, and this one supervising them.

Each child is an ordinary one-process gateway (``python -m gateway`` with
the same flags, ``--processes 1 --reuse-port``): its own event loop, its
own broker client, its own limits (``max_connections`` and
``max_open_connections`` count per process).  They all listen on the port
with ``SO_REUSEPORT``, and the kernel spreads new connections over them.

The parent binds the port first (with ``SO_REUSEPORT``, without listening),
so a port that is taken fails the start at once, as it does for one process,
``--port 0`` picks one port for all, and the port stays the gateway's while a
child restarts; so too the gRPC port, when ``--grpc-port`` sets one (each
child serves gRPC beside HTTP, with ``SO_REUSEPORT``).  It serves no request
itself.

It supervises the children as :mod:`zbatch.supervisor` does a stack, with
systemd's rules: it is READY=1 once every child is ready, pings its own
watchdog and holds each child to one; the first SIGTERM or SIGINT drains
every child (SIGKILL for one still running after its drain), a second one
reaches the children and ends them at once, and the parent exits with 128 +
the signal's number.  A child that exits is restarted with a growing delay
while the others serve, once the gateway has served; a child that fails
before that fails the start, and the parent exits with the child's status.

``/metrics`` is one page summed over the processes
(:mod:`gateway.metrics`: the parent gives the children a private
``PROMETHEUS_MULTIPROC_DIR`` and removes it at exit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from gateway.config import GatewayConfig
from gateway.metrics import MULTIPROCESS_ENV
from zbatch.client.aio import REPLY_GRACE_MS
from zbatch.supervisor.policy import STOP_MARGIN_S, Supervision, Unit
from zbatch.supervisor.shell import Program, Shell, child_watchdog_s

log = logging.getLogger("zbatch.gateway")
MIGRATE_REQUESTS = Path("/proc/sys/net/ipv4/tcp_migrate_req")  # Linux 5.14+


def serve_processes(config: GatewayConfig, argv: Sequence[str], processes: int) -> int:
    """Run ``processes`` gateways on ``config``'s port until stopped; returns the exit status."""
    reserved: list[socket.socket] = []
    try:
        for wanted in (config.port, config.grpc_port) if config.grpc_port else (config.port,):
            reserved += reserve_port(config.host, wanted)
    except OSError as exc:
        log.error("cannot serve on %s:%s: %s", config.host, wanted, exc)
        for sock in reserved:
            sock.close()
        return 1
    port = int(reserved[0].getsockname()[1])
    metrics_dir = tempfile.mkdtemp(prefix="zbatch-gateway-metrics-", dir=os.environ.get("RUNTIME_DIRECTORY"))
    try:
        stop_timeout_s = (config.timeout_ms + REPLY_GRACE_MS) / 1000 + STOP_MARGIN_S
        units = [Unit(f"gateway-{i}", "gateway", stop_timeout_s) for i in range(processes)]
        argv = [sys.executable, "-m", "gateway", *argv, "--processes", "1", "--reuse-port", "true",
                "--port", str(port)]
        programs = {unit.name: Program(argv, {MULTIPROCESS_ENV: metrics_dir}) for unit in units}
        supervision = Supervision(units, ("gateway",), watchdog_s=child_watchdog_s(), fail_fast=True)
        shell = Shell("zbatch-gateway", supervision, programs, log,
                      stop_signals=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
                      serving=lambda: f"{processes} gateway processes listening on {url(config.host, port)}",
                      on_exit=lambda pid: mark_process_dead(pid, metrics_dir))  # type: ignore[no-untyped-call]
        log.info("starting %d gateway processes on %s", processes, url(config.host, port))
        warn_of_resets()
        return asyncio.run(shell.run())
    finally:
        for sock in reserved:
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def reserve_port(host: str, port: int) -> list[socket.socket]:
    """Bind ``host``:``port`` as the children will (every address the host name has), without listening.

    Port 0 becomes one free port for every address.  Raises OSError as a taken port would.
    """
    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio's create_server does
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"{host!r} has no address to listen on")
    return sockets


def warn_of_resets() -> None:
    """Warn when the kernel would reset, rather than hand over, what it queued for a process that stops listening."""
    try:
        migrate = MIGRATE_REQUESTS.read_text().strip()
    except OSError:
        return  # not Linux, or a kernel without it
    if migrate == "0":
        log.warning("net.ipv4.tcp_migrate_req is 0: connections the kernel has queued for a gateway process that "
                    "drains or exits are reset instead of handed to another process; "
                    "sysctl -w net.ipv4.tcp_migrate_req=1 hands them over")


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
