"""Start real zbatch daemons on free loopback ports, wait until they serve, always stop them.

Every wait is on a condition with a timeout (never a bare sleep), and a
failed wait shows the daemon's log, so a broken start is easy to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zbatch.client import AsyncClient, ZBatchError
from zbatch.runtime import native
from zbatch.runtime.curve import CurveKeys

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, log: Callable[[], str] = str) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` and a log after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{log()}")


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    endpoints: dict[str, str] = field(default_factory=dict)
    curve: CurveKeys | None = None  # a CURVE broker: the keys its statistics are asked with

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- last lines of {self.name} log ---\n" + "\n".join(text.splitlines()[-40:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, wait, and SIGKILL if it does not exit in time; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s} s\n{self.log()}") from None

    @property
    def url(self) -> str:
        return self.endpoints["url"]

    @property
    def frontend(self) -> str:
        return self.endpoints["frontend"]

    @property
    def backend(self) -> str:
        return self.endpoints["backend"]


def _flags(settings: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in settings.items():
        args += ["--" + key.replace("_", "-"), ",".join(value) if isinstance(value, tuple) else str(value)]
    return args


def _spawn(module: str, name: str, settings: dict[str, Any], log_dir: Path,
           extra_env: dict[str, str] | None = None) -> Daemon:
    log_path = log_dir / f"{name}.log"
    # A test run under systemd must not have its daemons talk to that systemd.  Settings come from the
    # test, not the environment; a compiled build (scripts/test's second pass) carries on to the daemons.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZBATCH_", "NOTIFY_SOCKET", "WATCHDOG_")) or k == native.ENV}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)} | (extra_env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *_flags(settings)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
    return Daemon(name, process, log_path)


def broker_stats(frontend: str, timeout_ms: int = 1000, curve: CurveKeys | None = None) -> dict[str, Any] | None:
    """The broker's statistics, or None if it does not answer."""

    async def ask() -> dict[str, Any]:
        async with AsyncClient(frontend, connect_timeout_ms=timeout_ms, curve=curve) as client:
            return await client.stats(timeout_ms=timeout_ms)

    try:
        return asyncio.run(ask())
    except ZBatchError:
        return None


def start_broker(log_dir: Path, name: str = "broker", *, env: dict[str, str] | None = None,
                 curve: CurveKeys | None = None, **settings: Any) -> Daemon:
    """A broker on fresh ports, or on ``frontend``/``backend`` if given (a restart); ``env`` adds variables.

    ``curve``: a client's keys, for a broker started with CURVE settings.
    """
    frontend = settings.pop("frontend", f"tcp://127.0.0.1:{free_port()}")
    backend = settings.pop("backend", f"tcp://127.0.0.1:{free_port()}")
    daemon = _spawn("broker", name, {"frontend": frontend, "backend": backend} | settings, log_dir, env)
    daemon.endpoints = {"frontend": frontend, "backend": backend}
    daemon.curve = curve
    wait_until(lambda: not daemon.alive() or broker_stats(frontend, curve=curve) is not None, START_TIMEOUT_S,
               "the broker to answer", daemon.log)
    assert daemon.alive(), daemon.log()
    return daemon


def start_worker(broker: Daemon, log_dir: Path, name: str, *, wait: bool = True,
                 env: dict[str, str] | None = None, **settings: Any) -> Daemon:
    settings = {"backend": broker.backend, "name": name, "workers": 2} | settings
    daemon = _spawn("worker", name, settings, log_dir, env)
    if wait:
        wait_for_worker(broker, daemon)
    return daemon


def wait_for_worker(broker: Daemon, worker: Daemon) -> None:
    def registered() -> bool:
        assert worker.alive(), worker.log()
        stats = broker_stats(broker.frontend, curve=broker.curve) or {"workers": []}
        return any(w["name"] == worker.name for w in stats["workers"])

    wait_until(registered, START_TIMEOUT_S, f"worker {worker.name} to register", worker.log)


def start_gateway(broker: Daemon, log_dir: Path, *, env: dict[str, str] | None = None,
                  **settings: Any) -> Daemon:
    port = free_port()
    settings = {"frontend": broker.frontend, "port": port} | settings
    daemon = _spawn("gateway", "gateway", settings, log_dir, env)
    daemon.endpoints = {"url": f"http://127.0.0.1:{port}"}
    wait_until(lambda: not daemon.alive() or http_status(daemon.url + "/healthz") == 200, START_TIMEOUT_S,
               "the gateway to answer /healthz", daemon.log)
    assert daemon.alive(), daemon.log()
    return daemon


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def http_json(url: str, body: Any = None, headers: dict[str, str] | None = None,
              data: bytes | None = None, method: str | None = None) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; returns status, headers and the decoded JSON body."""
    if body is not None:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} | (headers or {})
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


@contextlib.contextmanager
def running_stack(log_dir: Path, workers: int = 2, *, broker: dict[str, Any] | None = None,
                  worker: dict[str, Any] | None = None, gateway: bool = True) -> Iterator[dict[str, Daemon]]:
    """Broker, ``workers`` workers named w1, w2, ... and a gateway; all stopped on exit, in reverse."""
    daemons: dict[str, Daemon] = {}
    try:
        daemons["broker"] = start_broker(log_dir, **(broker or {}))
        names = [f"w{i + 1}" for i in range(workers)]
        for name in names:
            daemons[name] = start_worker(daemons["broker"], log_dir, name, wait=False, **(worker or {}))
        for name in names:
            wait_for_worker(daemons["broker"], daemons[name])
        if gateway:
            daemons["gateway"] = start_gateway(daemons["broker"], log_dir)
        yield daemons
    finally:
        for daemon in reversed(list(daemons.values())):
            if daemon.alive():
                daemon.stop()
