"""Hosts for tests: Linux network namespaces on one bridge, each a host with a private address of its own.

A :class:`Network` is a switch namespace holding a bridge, and one namespace
per host joined to it by a veth pair; each host has ``eth0`` with an address
in ``10.200.0.0/24`` and its own loopback.  Nothing is added outside the
namespaces: no address, route or interface of this machine changes, and
traffic between the hosts never leaves them.  Daemons run inside a host
through ``ip netns exec`` (:meth:`Host.spawn`); the test reaches them from
a thread that has entered a host's namespace (:meth:`Host.call`, and
:meth:`Host.enter` for a load generator's thread).  Deleting the namespaces
at the end (always, :meth:`Network.close`) takes the veths and the bridge
with them.

Needs root and ``ip netns``; :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import zmq.asyncio

from zbatch.client import AsyncClient, ZBatchError
from zbatch.testing import Daemon, http_status, spawn_wrapped

T = TypeVar("T")
SUBNET = "10.200.0"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
PREFIX = "zbh"  # namespaces named zbh<pid>-<network>-<host>: a run's own, and those of dead runs to clean up
_networks = itertools.count()


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def ip(*args: str) -> None:
    """Run ``ip`` with ``args``; a failure raises with its message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def enter_namespace(netns: str) -> None:
    """Move the calling thread (only it) into network namespace ``netns``; threads it starts follow."""
    libc = ctypes.CDLL(None, use_errno=True)
    descriptor = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        if libc.setns(descriptor, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {netns}: {os.strerror(error)}")
    finally:
        os.close(descriptor)


@dataclass
class Host:
    role: str
    netns: str
    address: str

    def endpoint(self, port: int) -> str:
        return f"tcp://{self.address}:{port}"

    def url(self, port: int) -> str:
        return f"http://{self.address}:{port}"

    def spawn(self, module: str, name: str, log_dir: Path, /, *args: str, env: dict[str, str] | None = None,
              **settings: object) -> Daemon:
        """A daemon on this host (no wait).  The test network is private and has no CURVE keys, so the
        daemons are told to trust it (``ZBATCH_INSECURE``): without it they refuse its addresses."""
        return spawn_wrapped(["ip", "netns", "exec", self.netns], module, name, log_dir, *args,
                             env={"ZBATCH_INSECURE": "true"} | (env or {}), interpreter=None, **settings)

    def enter(self) -> None:
        enter_namespace(self.netns)

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a thread inside this host's namespace; its result or its exception."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                self.enter()
                outcome["result"] = function(*args)
            except BaseException as exc:  # handed to the caller
                outcome["error"] = exc

        thread = threading.Thread(target=run, name=f"in-{self.role}")
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        result: T = outcome["result"]
        return result

    def http_status(self, url: str) -> int | None:
        return self.call(http_status, url)

    def stats(self, frontend: str, timeout_ms: int = 1000) -> dict[str, Any] | None:
        """A broker's statistics asked from this host, or None if it does not answer."""
        return self.call(_stats, frontend, timeout_ms)

    def link(self, up: bool) -> None:
        """Take this host's network link down, or up again."""
        ip("-n", self.netns, "link", "set", "eth0", "up" if up else "down")


def _stats(frontend: str, timeout_ms: int) -> dict[str, Any] | None:
    async def ask() -> dict[str, Any]:
        context = zmq.asyncio.Context()  # made in this thread: its I/O thread is in this namespace
        try:
            async with AsyncClient(frontend, context=context, connect_timeout_ms=timeout_ms) as client:
                return await client.stats(timeout_ms=timeout_ms)
        finally:
            context.term()

    try:
        return asyncio.run(ask())
    except ZBatchError:
        return None


class Network:
    """Hosts named by ``roles`` on one bridge; use as a context manager, which always deletes them."""

    def __init__(self, roles: Sequence[str]) -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{next(_networks)}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._roles = list(roles)

    def __enter__(self) -> Network:
        remove_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getitem__(self, role: str) -> Host:
        return self.hosts[role]

    def _build(self) -> None:
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for number, role in enumerate(self._roles, start=10):
            host = Host(role, f"{self.tag}-{role}", f"{SUBNET}.{number}")
            ip("netns", "add", host.netns)
            self.hosts[role] = host
            port = f"v{number}"
            ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.netns, "link", "set", "eth0", "up")
            ip("-n", host.netns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Delete every namespace of this network (the processes in them must be stopped first)."""
        for netns in [*(host.netns for host in self.hosts.values()), self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        self.hosts.clear()


def remove_stale() -> None:
    """Delete the namespaces of earlier runs whose process is gone (a run killed before its cleanup)."""
    if not NETNS_DIR.is_dir():
        return
    for entry in NETNS_DIR.iterdir():
        name = entry.name
        pid = name[len(PREFIX):].split("-", 1)[0]
        if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 0)
        return True
    return False
