"""Start the systems under test as real subprocesses on free loopback ports, and always stop them.

Kept separate from tests/daemons.py on purpose: benchmarks must not depend on
test helpers, and they need async readiness checks (the load generator owns
the event loop) plus launchers for the fakes and baselines in this package.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from zbatch.client import AsyncClient, ZBatchError

ROOT = Path(__file__).resolve().parents[2]
MODEL = "all-MiniLM-L6-v2"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def log(message: str) -> None:
    """Progress goes to stderr, so stdout carries only the results table."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- last lines of {self.name} log ({self.log_path}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the process has not exited in time."""
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log(f"{self.name} ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s; killing it")
            self.popen.kill()
            self.popen.wait()


@dataclass
class Procs:
    """The processes of one system; ``close`` stops them all, newest first."""

    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="zbatch-bench-")))
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, module: str, name: str, *args: str, env: dict[str, str] | None = None) -> Proc:
        """``env`` adds variables; the caller's own ZBATCH_* settings never leak into a benchmark."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZBATCH_")} | (env or {})
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as out:
            popen = subprocess.Popen([sys.executable, "-m", module, *args], stdout=out,
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def pids(self) -> dict[str, int]:
        """Name: pid of each process started, so a measurement can price each one's CPU."""
        return {proc.name: proc.popen.pid for proc in self.procs}

    def close(self) -> None:
        while self.procs:
            proc = self.procs.pop()
            try:
                proc.stop()
            except Exception as exc:  # keep stopping the others whatever happens
                log(f"could not stop {proc.name}: {exc}")

    async def wait(self, condition: Callable[[], Awaitable[Any]], what: str,
                   timeout_s: float = START_TIMEOUT_S) -> Any:
        """Poll ``condition`` until truthy; fail with every dead process's log after the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited while waiting for {what}\n{dead[0].tail()}")
            result = await condition()
            if result:
                return result
            await asyncio.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}\n"
                           + "\n".join(p.tail() for p in self.procs))


async def broker_stats(frontend: str) -> dict[str, Any] | None:
    try:
        async with AsyncClient(frontend, connect_timeout_ms=300) as client:
            return await client.stats(timeout_ms=500)
    except ZBatchError:
        return None


async def http_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def start_broker(procs: Procs, *flags: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    frontend, backend = endpoint(), endpoint()
    procs.spawn("broker", "broker", "--frontend", frontend, "--backend", backend, *flags, env=env)
    await procs.wait(lambda: broker_stats(frontend), "the broker to answer STATS")
    return frontend, backend


async def wait_workers(procs: Procs, frontend: str, count: int) -> None:
    async def enough() -> bool:
        stats = await broker_stats(frontend)
        return stats is not None and len(stats["workers"]) >= count

    await procs.wait(enough, f"{count} worker(s) to register")


async def start_model_worker(procs: Procs, frontend: str, backend: str, name: str = "w0",
                             dtype: str = "float32") -> str:
    """One real worker with the whole machine's 2 torch threads, logging as deployed; returns its metrics URL."""
    port = free_port()
    procs.spawn("worker", name, "--backend", backend, "--name", name, "--workers", "1",
                "--torch-threads", "2", "--device", "cpu", "--dtype", dtype, "--metrics-port", str(port))
    await wait_workers(procs, frontend, 1)
    return f"http://127.0.0.1:{port}/metrics"


async def start_echo_workers(procs: Procs, frontend: str, backend: str, count: int, *flags: str) -> None:
    for i in range(count):
        procs.spawn("scripts.benchmarks.echo_worker", f"echo{i}", "broker", "--backend", backend,
                    "--name", f"echo{i}", *flags)
    await wait_workers(procs, frontend, count)


async def start_gateway(procs: Procs, frontend: str, *flags: str) -> str:
    port = free_port()
    # The default log level, as deployed.
    procs.spawn("gateway", "gateway", "--frontend", frontend, "--port", str(port), *flags)
    url = f"http://127.0.0.1:{port}"
    await procs.wait(lambda: http_ok(url + "/readyz"), "the gateway to be ready")
    return url


async def start_http_server(procs: Procs, module: str, name: str, *args: str) -> str:
    """A baseline or bare server from this package; it must answer GET /healthz when ready."""
    port = free_port()
    procs.spawn(module, name, *args, "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    await procs.wait(lambda: http_ok(url + "/healthz"), f"{name} to answer /healthz")
    return url
