"""The lifecycle every zbatch daemon runs: start, ready, serve, drain, close; signals, watchdog and /metrics.

Theory of operation
-------------------
A daemon is a :class:`Service`: hooks that say how it starts, when it is
ready, what ``systemctl status`` shows, how it drains and how it closes.
:func:`serve` calls them in one order, pairing start with close the way
aiohttp's ``AppRunner`` pairs ``setup`` with ``cleanup``, and stopping in
stages the way uvicorn's ``Server`` shuts down:

1. start: bind, connect, load (:meth:`Service.start`), which returns the
   daemon's essential tasks.  If it fails, close runs and the error goes on
   to ``__main__``, which turns an OSError or ValueError into one line.
   Then, before the loop runs any task the start created, so before any peer
   counts on the daemon, the garbage collector collects once, freezes what the
   start left alive and collects its young generation less often
   (:func:`zbatch.runtime.memory.collect_off_the_hot_path`): that full
   collection stops the loop, on a busy host for longer than a worker's
   heartbeat liveness, which a broker that had registered the worker would
   take for its death;
2. the ``/metrics`` page, when the service has a port for it;
3. ready: READY=1 for systemd once :meth:`Service.ready` returns (the worker:
   model loaded *and* registered with the broker); serving has begun already;
4. serve until the first SIGTERM or SIGINT;
5. drain: STOPPING=1, then :meth:`Service.drain`, which finishes what was
   accepted within the daemon's own deadline;
6. close: :meth:`Service.close`, whatever happened before.

Signals: the first SIGTERM or SIGINT starts the drain (once the start is
done, if it arrives during it).  A second one, at any stage after, ends the
process at once with status 128 + its number, logged: the same for every
daemon.  SIGHUP calls :meth:`Service.reload` for a service that overrides it;
for the others SIGHUP keeps its default action.

Open files: before it starts, a daemon raises its soft limit on open files
(RLIMIT_NOFILE) to the hard limit, and logs it.  Every connection is a file
descriptor, and the usual soft limit, 1024, is far below what the hard limit
allows: a daemon that reaches it can accept nobody new (libzmq even retries
the failing accept in a busy loop).

Essential tasks are the futures a daemon cannot serve without: the broker's
socket pump, the worker's broker link, inference thread and batch watchdog,
the gateway's HTTP listener.  While serving, one that ends (returns, raises
or is cancelled) is a fault: the process logs it and exits at once with
:data:`FAULT_EXIT_CODE`, for its supervisor to restart it, instead of
running on as a shell that pings systemd and serves nothing.  Once the drain
begins, tasks end on purpose and the drain's deadline bounds the rest.

The watchdog and the STATUS line are sent from a task on the event loop, so
a ping proves the loop turns; while serving, pings go out only while every
essential task is alive.  Outside systemd none of this sends anything.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, NoReturn

from prometheus_client.core import Metric

from zbatch.runtime import memory
from zbatch.runtime.metrics import start_metrics
from zbatch.runtime.sdnotify import Notifier

if sys.platform != "win32":  # Windows has no such limit
    import resource

FAULT_EXIT_CODE = 70  # EX_SOFTWARE: systemd's Restart=on-failure restarts the daemon
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

Essentials = Mapping[str, asyncio.Future[Any]]


class MetricsPage(NamedTuple):
    """Where the ``/metrics`` page listens (port 0: nowhere) and what builds its families."""

    host: str
    port: int
    families: Callable[[], list[Metric]]


class Service(abc.ABC):
    """One daemon's part of the lifecycle; :func:`serve` calls these hooks, in its order, on its loop."""

    name: ClassVar[str]  # "zbatch-broker": log lines say which daemon
    log: ClassVar[logging.Logger]  # the daemon's own logger: the lifecycle's lines appear under it
    # What malloc does with freed memory (zbatch.runtime.memory), set before start: "return" follows what
    # is held; a worker "keep"s its activations for the next batch.
    freed_memory: str = "return"

    @abc.abstractmethod
    async def start(self) -> Essentials:
        """Bind, connect, load; return the essential tasks by what they do ("the broker link": its task).

        Raise OSError or ValueError for what the operator must fix (a port taken, a missing model).
        """

    async def ready(self) -> None:
        """Return once systemd may count the daemon as started; by default, as soon as it started."""
        return None

    @abc.abstractmethod
    def status_line(self) -> str:
        """One line for ``systemctl status``; the lifecycle adds ", draining" while it drains."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Stop taking new work and finish what was accepted, within the daemon's own deadline."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything; runs after a drain, and after a failed or partial start too."""

    def reload(self) -> None:
        """SIGHUP: take up changed settings without a restart.  Override to handle SIGHUP at all."""
        return None

    def metrics(self) -> MetricsPage | None:
        """The ``/metrics`` page to serve, if any."""
        return None


async def serve(service: Service) -> None:
    """Run ``service`` from start to close.  Returns after a clean stop; a forced exit never returns."""
    raise_open_file_limit(service.log)
    await _Lifecycle(service).run()


def open_file_limit() -> int | None:
    """The soft limit on open files; None where there is none, or no way to know it."""
    if sys.platform == "win32":
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def raise_open_file_limit(log: logging.Logger) -> None:
    """Raise the soft limit on open files to the hard limit, and log the limit in force."""
    if sys.platform == "win32":
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        log.info("open files: the limit is %s", _limit(soft))
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files: the limit stays %s, as raising it to the hard limit, %s, failed: %s",
                    _limit(soft), _limit(hard), exc)
        return
    log.info("open files: the limit is %s, raised from %s", _limit(hard), _limit(soft))


def _limit(value: int) -> str:
    return "unlimited" if sys.platform != "win32" and value == resource.RLIM_INFINITY else str(value)


def exit_now(code: int) -> NoReturn:
    """End the process at once with ``code``: no drain, no cleanup (threads cannot be stopped), logs flushed."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


class _Lifecycle:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.log = service.log
        self.notifier = Notifier(self._status_line)
        self.essentials: Essentials = {}
        self.stopping = asyncio.Event()
        self._stop_metrics: Callable[[], None] = lambda: None
        self._keep_alive: asyncio.Task[None] | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._install_signals(loop)
        memory.apply(self.service.freed_memory, os.environ, self.log)  # before start allocates anything big
        try:
            await self._start()
            await self._serve()
            self.notifier.stopping()
            await self.service.drain()
        finally:
            await self._close()
            self._remove_signals(loop)
        self.log.info("%s stopped", self.service.name)

    async def _start(self) -> None:
        self.essentials = await self.service.start()
        if not self.stopping.is_set():
            # Before the loop runs what start() set going (the worker's link sends READY): see step 1 above.
            memory.collect_off_the_hot_path(self.log)
        for name, future in self.essentials.items():
            future.add_done_callback(functools.partial(self._essential_ended, name))
        page = self.service.metrics()
        if page is not None:
            self._stop_metrics = start_metrics(page.host, page.port, page.families)
        self._keep_alive = asyncio.get_running_loop().create_task(self.notifier.keep_alive(self._healthy))

    async def _serve(self) -> None:
        """Until the first stop signal; READY=1 goes out when the service is ready, if that comes first."""
        ready = asyncio.ensure_future(self.service.ready())
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((ready, stop), return_when=asyncio.FIRST_COMPLETED)
            if ready.done():
                ready.result()  # a ready() that raises is a bug: it ends the daemon with its traceback
                if not self.stopping.is_set():
                    self.notifier.ready()
            await stop
        finally:
            ready.cancel()
            stop.cancel()

    async def _close(self) -> None:
        self.stopping.set()  # from here on, tasks end on purpose
        self._stop_metrics()
        try:
            await self.service.close()
        finally:
            if self._keep_alive is not None:
                self._keep_alive.cancel()

    def _status_line(self) -> str:
        return self.service.status_line() + (", draining" if self.stopping.is_set() else "")

    def _healthy(self) -> bool:
        return self.stopping.is_set() or not any(future.done() for future in self.essentials.values())

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        if type(self.service).reload is not Service.reload:
            loop.add_signal_handler(signal.SIGHUP, self.service.reload)

    def _remove_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (*STOP_SIGNALS, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if self.stopping.is_set():
            self.log.error("%s while stopping: exiting now, without finishing the drain", sig.name)
            self.notifier.status(f"exited on a second stop signal ({sig.name})")
            exit_now(128 + sig)
        self.log.info("%s: stopping (a second SIGTERM or SIGINT exits at once)", sig.name)
        self.stopping.set()

    def _essential_ended(self, name: str, future: asyncio.Future[Any]) -> None:
        error = None if future.cancelled() else future.exception()  # retrieved, so asyncio never reports it
        if self.stopping.is_set():
            return
        how = "was cancelled" if future.cancelled() else f"failed: {error!r}" if error else "returned"
        self.log.critical("%s %s while serving: exiting with status %d for a restart", name, how,
                          FAULT_EXIT_CODE, exc_info=error)
        self.notifier.status(f"exited: {name} {how}")
        exit_now(FAULT_EXIT_CODE)
