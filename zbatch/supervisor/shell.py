"""The supervisor's I/O: processes, signals, notifications, logs, around :class:`~zbatch.supervisor.policy.Supervision`.

:class:`Shell` carries out what the policy decides and reports back what
happened; it decides nothing itself.

* Each child runs in a process group of its own, so a Ctrl-C in the terminal
  reaches only the supervisor, which then sends each daemon the one SIGTERM
  that drains it (the terminal's SIGINT on top would be a second stop signal,
  which ends a daemon at once).
* Each child gets a ``$NOTIFY_SOCKET`` of the supervisor's
  (:mod:`zbatch.supervisor.notify`), and ``$WATCHDOG_USEC`` when the policy
  has a watchdog: READY=1 and WATCHDOG=1 reach the policy as they would reach
  systemd.  The supervisor's own ``$NOTIFY_SOCKET``, if systemd gave it one,
  hears READY=1 once every child is ready, STOPPING=1, a STATUS line and
  watchdog pings.
* The first SIGTERM or SIGINT (and SIGHUP, when asked: a closed terminal)
  stops the stack in order; a second one stops it at once.
* Every start, exit (with its status: a code or a signal), restart delay,
  signal sent and readiness is logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from zbatch.runtime.sdnotify import Notifier, watchdog_interval_s
from zbatch.supervisor.notify import Listener, open_listener
from zbatch.supervisor.policy import Action, Exited, Forward, Kill, Phase, Ready, Start, Supervision, Term

PRIVATE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")  # the supervisor's own, never its children's
DEFAULT_WATCHDOG_S = 30.0  # the systemd units' WatchdogSec


def child_watchdog_s() -> float:
    """How long a ready child may go without WATCHDOG=1: the supervisor's own watchdog timeout when systemd
    holds it to one (its children are then held to the same), else the units' 30 s."""
    interval = watchdog_interval_s()  # half the timeout
    return 2 * interval if interval else DEFAULT_WATCHDOG_S


@dataclass(frozen=True)
class Program:
    """How to run one unit: its command line and the variables it gets on top of the supervisor's."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Child:
    name: str
    process: asyncio.subprocess.Process
    waiter: asyncio.Task[None]


class Shell:
    """Run ``supervision`` over real processes until it is done; :meth:`run` returns the exit code."""

    def __init__(self, name: str, supervision: Supervision, programs: Mapping[str, Program], log: logging.Logger, *,
                 stop_signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
                 serving: Callable[[], str] = lambda: "every daemon is ready",
                 on_exit: Callable[[int], None] = lambda pid: None) -> None:
        self.name = name  # the supervisor's own: "zbatch-serve"
        self.supervision = supervision
        self.programs = programs
        self.log = log
        self.stop_signals = tuple(stop_signals)
        self.serving = serving  # the line logged once the whole stack serves
        self.on_exit = on_exit  # called with the pid of every child that exited
        self.children: dict[str, _Child] = {}
        self.statuses: dict[str, str] = {}  # each child's last STATUS=
        self._wake = asyncio.Event()
        self._listener: Listener | None = None
        self._notifier = Notifier(self._status_line)
        self._stop_requests = 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._listener = open_listener(self._notified)
        if self._listener is not None:
            self._listener.start(loop)
        for sig in self.stop_signals:
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        keep_alive = loop.create_task(self._notifier.keep_alive())
        try:
            code = await self._loop(loop)
            self.log.info("%s stopped%s", self.name, f" with status {code}" if code else "")
            return code
        finally:
            keep_alive.cancel()
            for sig in self.stop_signals:
                loop.remove_signal_handler(sig)
            for child in self.children.values():  # only after a bug in the loop: leave no orphan behind
                if child.process.returncode is None:
                    child.process.kill()
            if self._listener is not None:
                self._listener.close()

    async def _loop(self, loop: asyncio.AbstractEventLoop) -> int:
        supervision = self.supervision
        while supervision.exit_code is None:
            for action in supervision.tick(loop.time()):
                await self._apply(action)
            if supervision.exit_code is not None:
                break
            wakeup = supervision.next_wakeup()
            timeout = None if wakeup is None else max(0.0, wakeup - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            self._wake.clear()
        return supervision.exit_code

    # ------------------------------------------------------------------------------------- actions

    async def _apply(self, action: Action) -> None:
        if isinstance(action, Start):
            await self._start(action.unit)
        else:
            self._send(action)

    def _send(self, action: Term | Kill | Forward) -> None:
        """Signal a running unit as ``action`` says."""
        child = self.children.get(action.unit)
        if child is None or child.process.returncode is not None:
            return  # it has exited meanwhile: its exit is on its way to the policy
        pid = child.process.pid
        if isinstance(action, Term):
            timeout = self._unit_timeout(action.unit)
            self.log.info("stopping %s (pid %d): SIGTERM, then SIGKILL if it has not exited in %.0f s",
                          action.unit, pid, timeout)
            child.process.send_signal(signal.SIGTERM)
        elif isinstance(action, Kill):
            self.log.warning("killing %s (pid %d): %s", action.unit, pid, action.reason)
            child.process.kill()
        elif isinstance(action, Forward):
            child.process.send_signal(action.signum)

    async def _start(self, name: str) -> None:
        program = self.programs[name]
        loop = asyncio.get_running_loop()
        try:
            process = await asyncio.create_subprocess_exec(
                *program.argv, env=self._child_env(program), stdin=subprocess.DEVNULL, process_group=0)
        except OSError as exc:
            self.log.error("cannot start %s: %s (command: %s)", name, exc, " ".join(program.argv))
            self._report_exit(name, None, 127)
            return
        self.supervision.started(name, loop.time())
        waiter = loop.create_task(self._wait(name, process))
        self.children[name] = _Child(name, process, waiter)
        self.log.info("started %s (pid %d)", name, process.pid)
        if self._listener is None:  # no way to hear READY=1 here: running is all there is to know
            self._report_ready(name, process.pid)

    async def _wait(self, name: str, process: asyncio.subprocess.Process) -> None:
        status = await process.wait()
        self._report_exit(name, process.pid, status)

    # ------------------------------------------------------------------------------------- reports

    def _report_exit(self, name: str, pid: int | None, status: int) -> None:
        loop = asyncio.get_running_loop()
        child = self.children.get(name)
        if child is not None and child.process.pid == pid:
            del self.children[name]
        self.statuses.pop(name, None)
        exited = self.supervision.exited(name, status, loop.time())
        self._log_exit(exited, pid)
        if pid is not None:
            self.on_exit(pid)
        self._wake.set()

    def _log_exit(self, exited: Exited, pid: int | None) -> None:
        who = f"{exited.unit} (pid {pid})" if pid is not None else exited.unit
        if exited.expected:
            level = logging.INFO if exited.status == 0 else logging.WARNING
            self.log.log(level, "%s stopped with %s, %.1f s after it started", who, exited.status, exited.ran_s)
            return
        why = " (killed: its watchdog went silent)" if exited.watchdog else ""
        if exited.fatal:
            self.log.error("%s exited with %s%s after %.1f s: not restarting it, and stopping everything: %s",
                           who, exited.status, why, exited.ran_s, exited.fatal)
        elif exited.given_up:
            self.log.error("%s exited with %s after %.1f s: not restarting it, while the others keep serving: %s",
                           who, exited.status, exited.ran_s, exited.given_up)
        elif exited.restart_in_s is None:
            self.log.warning("%s exited with %s while everything stops: not restarting it", who, exited.status)
        else:
            self.log.warning("%s exited unexpectedly with %s%s after %.1f s (%d exit%s in a row): restarting in "
                             "%.1f s", who, exited.status, why, exited.ran_s, exited.exits_in_a_row,
                             "" if exited.exits_in_a_row == 1 else "s", exited.restart_in_s)

    def _notified(self, pid: int, fields: dict[str, str]) -> None:
        name = next((c.name for c in self.children.values() if c.process.pid == pid), None)
        if name is None:
            return  # not a child of ours (or one already reaped)
        loop = asyncio.get_running_loop()
        if "STATUS" in fields:
            self.statuses[name] = fields["STATUS"]
        if fields.get("WATCHDOG") == "1":
            self.supervision.pinged(name, loop.time())
        if fields.get("READY") == "1":
            self._report_ready(name, pid)
        self._wake.set()

    def _report_ready(self, name: str, pid: int) -> None:
        ready = self.supervision.ready(name, asyncio.get_running_loop().time())
        if ready is not None:
            self._log_ready(ready, pid)
        self._wake.set()

    def _log_ready(self, ready: Ready, pid: int) -> None:
        if ready.down_s is None:
            self.log.info("%s (pid %d) is ready", ready.unit, pid)
        else:
            self.log.info("%s (pid %d) is ready again, %.1f s after it exited (start %d)", ready.unit, pid,
                          ready.down_s, ready.starts)
        if ready.stack_serves:
            self.log.info("%s", self.serving())
            self._notifier.ready()

    # ------------------------------------------------------------------------------------- signals

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        loop = asyncio.get_running_loop()
        self._stop_requests += 1
        if self._stop_requests == 1:
            order = self.supervision.stop_order
            what = f"{order[0]}s" if len(order) == 1 else "in order: " + ", then ".join(f"{g}s" for g in order)
            self.log.info("%s: stopping %s, each within its drain time; a second SIGTERM or SIGINT stops at once",
                          sig.name, what)
            self.supervision.stop(loop.time())
            self._notifier.stopping()
        else:
            self.log.error("%s while stopping: stopping every daemon at once, without finishing the drain",
                           sig.name)
            self._notifier.status(f"stopping at once ({sig.name})")
            for action in self.supervision.stop_at_once(loop.time(), sig):
                self._send(action)
        self._wake.set()

    # ------------------------------------------------------------------------------------- helpers

    def _child_env(self, program: Program) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        if self._listener is not None:
            env["NOTIFY_SOCKET"] = self._listener.address
            if self.supervision.watchdog_s is not None:
                env["WATCHDOG_USEC"] = str(int(self.supervision.watchdog_s * 1_000_000))
        return env | dict(program.env)

    def _unit_timeout(self, name: str) -> float:
        return next(u.stop_timeout_s for u in self.supervision.units if u.name == name)

    def _status_line(self) -> str:
        counts = self.supervision.counts()
        total = sum(counts.values())
        ready = counts.get(Phase.READY, 0)
        line = f"{ready} of {total} daemons ready"
        if self.supervision.stopping:
            line += ", stopping"
        elif counts.get(Phase.BACKOFF):
            line += f", {counts[Phase.BACKOFF]} waiting to restart"
        if counts.get(Phase.FAILED):
            line += f", {counts[Phase.FAILED]} stopped for good (see the log)"
        return line
