"""The systems the benchmarks start, built on the harness the tests use (:mod:`zbatch.testing`).

Each system is a :class:`~zbatch.testing.Daemons` group: real daemons on free
loopback ports, started by their command-line flags, plus the fakes and
baselines of this package, stopped together.  The harness blocks and the load
generator owns the event loop, so starts and waits run in a thread
(:func:`blocking`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from scripts.benchmarks.common import cpu
from zbatch.testing import (
    Daemon,
    DaemonFailure,
    Daemons,
    free_port,
    spawn,
    start_broker,
    start_gateway,
    start_http,
    start_worker,
    wait_for_worker,
)

P = ParamSpec("P")
T = TypeVar("T")

MODEL = "all-MiniLM-L6-v2"
LEFTOVER_GRACE_S = 10.0  # how long a stopped system's own processes may take to follow it
ECHO_WORKER = "scripts.benchmarks.systems.echo_worker"
BASELINES = "scripts.benchmarks.systems.baselines"  # the HF guide's servers and the bare one


def log(message: str) -> None:
    """Progress goes to stderr, so stdout carries only the results table."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def blocking(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)`` in a thread.  Cancelled, this still waits for the call to return before passing
    the cancellation on, so every daemon it started is in its group by the time the caller stops the group."""
    task = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


async def start(daemons: Daemons, build: Callable[Concatenate[Daemons, P], T], *args: P.args,
                **kwargs: P.kwargs) -> T:
    """:func:`blocking` ``build(daemons, *args, **kwargs)``, which starts daemons into ``daemons``.

    If it fails, every daemon in ``daemons`` is stopped.
    """
    try:
        return await blocking(build, daemons, *args, **kwargs)
    except BaseException:
        stop(daemons)
        raise


def stop(daemons: Daemons) -> None:
    """Stop a system; a daemon that had to be killed is logged, and the run goes on."""
    try:
        daemons.close()
    except DaemonFailure as failure:
        log(f"stopping a system: {failure}")


def _signal_trees(daemons: Daemons, signum: int) -> list[int]:
    """Send ``signum`` to every process of ``daemons`` and to all their descendants; returns their pids."""
    pids = [pid for daemon in daemons.values() if daemon.alive() for pid in cpu.tree(daemon.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return pids


def pause(daemons: Daemons) -> None:
    """Freeze a system, child processes included (SIGSTOP), so that it takes no CPU while others are measured.

    Some servers poll while idle (LitServe's batching loop wakes every millisecond): left running,
    they would take CPU from whatever the bench measures meanwhile.
    """
    _signal_trees(daemons, signal.SIGSTOP)


def resume(daemons: Daemons) -> None:
    """Undo :func:`pause` (SIGCONT to the same processes)."""
    _signal_trees(daemons, signal.SIGCONT)


def stop_tree(daemons: Daemons) -> None:
    """:func:`stop` a system that starts processes of its own, then kill what it left behind.

    A paused system is resumed first, so that it can exit on SIGTERM.  Its descendants are listed
    before the stop; any still running LEFTOVER_GRACE_S after it (a server that did not stop its
    workers) get SIGKILL.
    """
    pids = _signal_trees(daemons, signal.SIGCONT)
    stop(daemons)
    deadline = time.monotonic() + LEFTOVER_GRACE_S  # orphans may still be on their way out (Ray's)
    while (left := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        log(f"killed {len(left)} process(es) that {', '.join(daemons)} left running after SIGTERM")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


@contextmanager
def running() -> Iterator[Daemons]:
    """A new, empty system (a group of daemons with its own log folder), stopped at the end of the block."""
    daemons = Daemons()
    try:
        yield daemons
    finally:
        stop(daemons)


def start_echo_system(daemons: Daemons, workers: int, *flags: str, env: dict[str, str] | None = None) -> Daemon:
    """A broker (``env`` added to its environment) and ``workers`` instant workers (systems/echo_worker.py, ``flags``)
    named echo0, echo1, ...; returns the broker."""
    broker = daemons.add(start_broker(daemons.log_dir, env=env))
    echoes = [daemons.add(spawn(ECHO_WORKER, f"echo{i}", daemons.log_dir, "broker", *flags,
                                backend=broker.backend, name=f"echo{i}")) for i in range(workers)]
    for echo in echoes:
        wait_for_worker(broker, echo)
    return broker


def start_model_worker(daemons: Daemons, broker: Daemon, dtype: str = "float32") -> Daemon:
    """One real worker with the whole machine's 2 torch threads, logging as deployed, metrics on."""
    port = free_port()
    worker = daemons.add(start_worker(broker, daemons.log_dir, "w0", workers=1, torch_threads=2, device="cpu",
                                      dtype=dtype, metrics_port=port))
    worker.endpoints["metrics"] = f"http://127.0.0.1:{port}/metrics"
    return worker


def start_serve_workers(daemons: Daemons, broker: Daemon, workers: int = 2, **settings: Any) -> list[Daemon]:
    """``workers`` real workers as ``scripts/serve`` starts them (``--workers N``, sharing the cores through
    their cores ledger), metrics on; ``settings`` as their flags (``runtime="torch"``, say)."""
    started = []
    for index in range(workers):
        port = free_port()
        worker = daemons.add(start_worker(broker, daemons.log_dir, f"worker-{index}", wait=False, workers=workers,
                                          device="cpu", metrics_port=port, **settings))
        worker.endpoints["metrics"] = f"http://127.0.0.1:{port}/metrics"
        started.append(worker)
    for worker in started:
        wait_for_worker(broker, worker)
    return started


def start_deployed_gateway(daemons: Daemons, broker: Daemon, **settings: Any) -> str:
    """The gateway at its default log level, as deployed (``settings`` as its flags), once it reaches the broker.

    Returns its URL.
    """
    return daemons.add(start_gateway(broker, daemons.log_dir, ready="/readyz", **settings)).url


def start_http_server(daemons: Daemons, module: str, name: str, *args: str) -> str:
    """A baseline or bare server from this package, once it answers GET /healthz; returns its URL."""
    return daemons.add(start_http(module, name, daemons.log_dir, *args)).url
