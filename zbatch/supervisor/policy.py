"""What a supervisor decides, without doing any of it: which daemon to start, restart, signal or kill, and when.

Sans-I/O: :class:`Supervision` is told what happened (a process started,
said READY=1, pinged its watchdog, exited; the operator asked to stop) with
the time from an injected clock, and answers with :class:`Start`,
:class:`Term`, :class:`Kill` and :class:`Forward` actions for the caller to
carry out (:mod:`zbatch.supervisor.shell`), and with records of what it
decided, for the caller to log.  It imports neither ``asyncio`` nor
``subprocess``, so every rule is tested on a fake clock.

The rules, modelled on systemd's:

* **Start order.** A unit starts once every unit of the groups it comes
  ``after`` has been ready (READY=1) once: workers and gateways after the
  brokers.  A restart waits for nothing.
* **Restart.** Any exit the supervisor did not ask for is unexpected, a clean
  one included (a worker stopped with ``kill -TERM`` drains and exits 0): the
  unit is restarted, as systemd's ``Restart=always`` would, since the only way
  to stop a daemon of the stack is to stop the stack.  The delay starts at
  :attr:`Backoff.first_s` and doubles with each exit in a row, up to
  :attr:`Backoff.max_s` (systemd's ``RestartSec``, ``RestartSteps`` and
  ``RestartMaxDelaySec``); a unit that stayed ready for
  :attr:`Backoff.reset_after_s` starts again from the first delay.
* **Giving up.** There is no start limit (systemd's ``StartLimitBurst``): a
  daemon that cannot start on a serving host usually waits for something
  outside it (its broker's host, GPU memory), and the capped backoff already
  bounds what retrying costs.  The exceptions are the exits that say a restart
  cannot help (like systemd's ``RestartPreventExitStatus=2 78``): exit status
  2 before the unit was ever ready, which is how every zbatch daemon reports
  bad settings, ends the supervisor; exit status 78 (EX_CONFIG), a worker's
  answer to a model it cannot get (no such folder or Hub id, no access, not in
  the cache while offline: :mod:`zbatch.hub`), ends it too before the stack
  has served once, and afterwards leaves that unit stopped (:attr:`Phase.FAILED`)
  while the others keep serving.  With ``fail_fast``, any exit before the
  whole stack has served once ends the supervisor, for one that must fail its
  own start the way one process would (the gateway's ``--processes``).
* **Watchdog.** With ``watchdog_s``, a unit that said READY=1 must send
  WATCHDOG=1 at least that often; one that falls silent is killed, and then
  restarted like any other exit.
* **Stop.** On the operator's stop, the groups are stopped one after the
  other in ``stop_order`` (gateways, then workers, then brokers): every unit of
  a group gets SIGTERM, which starts its drain, and SIGKILL if it has not
  exited within its ``stop_timeout_s``; the next group begins once the last one
  is gone.  Units waiting to (re)start are simply not started.
* **Stop at once.** A second stop signal forwards that signal to the units
  already draining (a zbatch daemon exits at once on its second one) and kills
  the ones not yet asked to stop; whatever is left after
  :data:`FORCE_GRACE_S` is killed.

Exit codes of the supervisor: 0 after a stop the operator asked for, 2 after
bad settings, 78 after a model that cannot be had, the unit's own status
after a ``fail_fast`` failure, and 128 + the signal's number after a stop at
once.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from zbatch.hub import CONFIG_EXIT_CODE

FORCE_GRACE_S = 2.0  # after a stop at once: how long units get to exit before SIGKILL
STOP_MARGIN_S = 10.0  # a unit's stop timeout past its drain: closing, threads, logs (the units' TimeoutStopSec too)
BAD_SETTINGS_EXIT = 2  # every zbatch daemon exits 2 when a setting is bad (zbatch/runtime/settings.py)
CANNOT_HELP = {BAD_SETTINGS_EXIT: "exit status 2 is a zbatch daemon's answer to bad settings, and they would stay bad",
               CONFIG_EXIT_CODE: "exit status 78 is a worker's answer to a model it cannot get as set (its last line "
                                 "says why), and a restart would not get it either"}


@dataclass(frozen=True)
class Backoff:
    """Restart delays: ``first_s`` after one exit, doubling with each exit in a row, at most ``max_s``."""

    first_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0  # ready this long: the next exit counts as the first again

    def __post_init__(self) -> None:
        if self.first_s < 0 or self.max_s < self.first_s or self.reset_after_s < 0:
            raise ValueError(f"restart delays must satisfy 0 <= first <= max and reset >= 0: got {self}")

    def delay_s(self, exits_in_a_row: int) -> float:
        """The wait before restarting a unit that has exited ``exits_in_a_row`` times (1 or more)."""
        if exits_in_a_row <= 1 or self.first_s == 0:
            return self.first_s
        # Doubling overflows a float long after it passed any cap: stop doubling at the cap.
        return min(self.first_s * 2.0 ** min(exits_in_a_row - 1, 64), self.max_s)


@dataclass(frozen=True)
class Unit:
    """One daemon the supervisor keeps running."""

    name: str  # unique: "broker-0", "worker-1", "gateway"
    group: str  # what kind of daemon: the start dependencies and the stop order are by group
    stop_timeout_s: float  # from SIGTERM: its drain, plus a margin; then SIGKILL
    after: tuple[str, ...] = ()  # groups that must have been ready once before this unit first starts


class ExitStatus(int):
    """A process's exit as :class:`subprocess.Popen` reports it: a code, or minus the signal that ended it."""

    @property
    def signum(self) -> int | None:
        """The signal that ended the process, if one did."""
        return -self if self < 0 else None

    def __str__(self) -> str:
        if self < 0:
            try:
                return f"signal {signal.Signals(-self).name}"
            except ValueError:
                return f"signal {-self}"
        return f"status {int(self)}"


# ----------------------------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Start:
    unit: str


@dataclass(frozen=True)
class Term:
    """Send SIGTERM: the unit drains and exits within its stop timeout."""

    unit: str


@dataclass(frozen=True)
class Kill:
    """Send SIGKILL; ``reason`` says why, for the log."""

    unit: str
    reason: str


@dataclass(frozen=True)
class Forward:
    """Pass the operator's second stop signal on to a draining unit, which then exits at once."""

    unit: str
    signum: int


Action = Start | Term | Kill | Forward


# ----------------------------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Exited:
    """What the supervisor made of one exit, for the log."""

    unit: str
    status: ExitStatus
    ran_s: float  # since it started
    expected: bool  # it was asked to stop
    restart_in_s: float | None = None  # when it will be started again, if it will
    exits_in_a_row: int = 0
    watchdog: bool = False  # it was killed because its watchdog went silent
    fatal: str = ""  # why the whole supervisor stops, if it does
    given_up: str = ""  # why this unit is not restarted while the others go on, if it is not


@dataclass(frozen=True)
class Ready:
    """A unit said READY=1."""

    unit: str
    starts: int  # 1 for its first start
    down_s: float | None  # since its last exit, for a restarted unit
    stack_serves: bool  # this made every unit ready for the first time


class Phase(enum.Enum):
    WAITING = "waiting for the units it starts after"
    STARTING = "started, not ready yet"
    READY = "ready"
    BACKOFF = "waiting to restart"
    STOPPING = "stopping"
    DONE = "stopped"
    FAILED = "not restarted: its exit said a restart cannot help"


@dataclass
class _State:
    unit: Unit
    phase: Phase = Phase.WAITING
    starts: int = 0
    ever_ready: bool = False
    started_at: float = 0.0
    ready_at: float | None = None
    exited_at: float | None = None
    exits_in_a_row: int = 0
    restart_at: float = 0.0
    last_ping: float = 0.0
    deadline: float | None = None  # stopping: when it gets SIGKILL
    killed: str = ""  # why it was sent SIGKILL, if it was
    termed: bool = False


@dataclass
class Supervision:
    """The restart and stop policy for a fixed set of units; every method takes the clock's ``now``.

    Drive it like this: call :meth:`tick` and carry out its actions, report each
    outcome (:meth:`started`, :meth:`ready`, :meth:`pinged`, :meth:`exited`,
    :meth:`stop`, :meth:`stop_at_once`), and call :meth:`tick` again at
    :meth:`next_wakeup` or after any report.  :attr:`exit_code` is set once the
    supervisor is done.
    """

    units: Sequence[Unit]
    stop_order: Sequence[str]  # groups, first stopped first
    backoff: Backoff = field(default_factory=Backoff)
    watchdog_s: float | None = None
    fail_fast: bool = False
    exit_code: int | None = None
    stack_served: bool = False  # every unit has been ready at once
    _states: dict[str, _State] = field(default_factory=dict)
    _stopping: bool = False
    _stage: int = 0
    _final_code: int = 0
    _force_deadline: float | None = None

    def __post_init__(self) -> None:
        groups = {unit.group for unit in self.units}
        missing = groups - set(self.stop_order)
        if missing:
            raise ValueError(f"stop_order must list every group; it lacks {', '.join(sorted(missing))}")
        for unit in self.units:
            if unit.name in self._states:
                raise ValueError(f"two units are named {unit.name!r}; each needs a name of its own")
            unknown = set(unit.after) - groups
            if unknown:
                raise ValueError(f"{unit.name} starts after {', '.join(sorted(unknown))}, which no unit belongs to")
            self._states[unit.name] = _State(unit)

    # ------------------------------------------------------------------------------------- queries

    @property
    def stopping(self) -> bool:
        return self._stopping

    def phase(self, name: str) -> Phase:
        return self._states[name].phase

    def counts(self) -> dict[Phase, int]:
        """How many units are in each phase (for a status line)."""
        found: dict[Phase, int] = {}
        for state in self._states.values():
            found[state.phase] = found.get(state.phase, 0) + 1
        return found

    def next_wakeup(self) -> float | None:
        """The earliest time :meth:`tick` has something to do, if any."""
        times: list[float] = []
        for state in self._states.values():
            if state.phase is Phase.BACKOFF and not self._stopping:
                times.append(state.restart_at)
            elif state.phase is Phase.STOPPING and state.deadline is not None and not state.killed:
                times.append(state.deadline)
            elif state.phase is Phase.READY and self.watchdog_s is not None and not state.killed:
                times.append(state.last_ping + self.watchdog_s)
        if self._force_deadline is not None:
            times.append(self._force_deadline)
        return min(times, default=None)

    # ------------------------------------------------------------------------------------- the clock

    def tick(self, now: float) -> list[Action]:
        """Everything due at ``now``: starts, restarts, watchdog kills, the stop's next steps."""
        if self.exit_code is not None:
            return []
        if self._stopping:
            return self._stop_steps(now)
        actions: list[Action] = []
        ready_groups = self._ever_ready_groups()
        for state in self._states.values():
            if state.phase is Phase.WAITING and set(state.unit.after) <= ready_groups:
                actions.append(self._start(state, now))
            elif state.phase is Phase.BACKOFF and now >= state.restart_at:
                actions.append(self._start(state, now))
            elif (state.phase is Phase.READY and self.watchdog_s is not None and not state.killed
                  and now >= state.last_ping + self.watchdog_s):
                state.killed = f"no watchdog ping for {self.watchdog_s:g} s"
                actions.append(Kill(state.unit.name, state.killed))
        return actions

    # ------------------------------------------------------------------------------------- reports

    def started(self, name: str, now: float) -> None:
        """The unit's process runs (reported after a :class:`Start`)."""
        state = self._states[name]
        state.started_at = now

    def ready(self, name: str, now: float) -> Ready | None:
        """The unit said READY=1; None if that changes nothing (a repeat, or a unit on its way out)."""
        state = self._states[name]
        if state.phase is not Phase.STARTING:
            return None
        state.phase = Phase.READY
        state.ever_ready = True
        state.ready_at = state.last_ping = now
        down_s = None if state.exited_at is None else now - state.exited_at
        serves = False
        if not self.stack_served and all(s.phase is Phase.READY for s in self._states.values()):
            self.stack_served = serves = True
        return Ready(name, state.starts, down_s, serves)

    def pinged(self, name: str, now: float) -> None:
        """The unit sent WATCHDOG=1."""
        state = self._states[name]
        if state.phase is Phase.READY:
            state.last_ping = now

    def exited(self, name: str, status: int, now: float) -> Exited:
        """The unit's process has exited with ``status`` (Popen's returncode)."""
        state = self._states[name]
        status = ExitStatus(status)
        ran_s = now - state.started_at
        was_ready_for = None if state.ready_at is None or state.phase is not Phase.READY else now - state.ready_at
        watchdog = bool(state.killed) and state.phase is Phase.READY
        asked = state.phase is Phase.STOPPING
        state.exited_at, state.ready_at, state.deadline = now, None, None
        state.killed, state.termed = "", False
        if self._stopping:  # asked to stop, or on its own while the stack stops: not restarted either way
            state.phase = Phase.DONE
            return Exited(name, status, ran_s, expected=asked)
        if was_ready_for is not None and was_ready_for >= self.backoff.reset_after_s:
            state.exits_in_a_row = 0
        state.exits_in_a_row += 1
        fatal = ""
        if status == CONFIG_EXIT_CODE and self.stack_served:
            state.phase = Phase.FAILED
            return Exited(name, status, ran_s, expected=False, exits_in_a_row=state.exits_in_a_row,
                          watchdog=watchdog, given_up=CANNOT_HELP[CONFIG_EXIT_CODE])
        if status == CONFIG_EXIT_CODE or (status == BAD_SETTINGS_EXIT and not state.ever_ready):
            fatal = CANNOT_HELP[status]
            self._final_code = int(status)
        elif self.fail_fast and not self.stack_served:
            fatal = "it exited before everything served once, so the start failed"
            self._final_code = status if status > 0 else 128 + (status.signum or 0)
        if fatal:
            state.phase = Phase.DONE
            self._begin_stop()
            return Exited(name, status, ran_s, expected=False, exits_in_a_row=state.exits_in_a_row,
                          watchdog=watchdog, fatal=fatal)
        delay = self.backoff.delay_s(state.exits_in_a_row)
        state.phase, state.restart_at = Phase.BACKOFF, now + delay
        return Exited(name, status, ran_s, expected=False, restart_in_s=delay,
                      exits_in_a_row=state.exits_in_a_row, watchdog=watchdog)

    def stop(self, now: float) -> None:
        """The operator asked to stop: stop the groups in order, each within its units' stop timeouts."""
        self._begin_stop()

    def stop_at_once(self, now: float, signum: int) -> list[Kill | Forward]:
        """The operator asked again: every unit is to exit now; the supervisor exits 128 + ``signum``."""
        self._begin_stop()
        self._final_code = 128 + signum
        self._force_deadline = now + FORCE_GRACE_S
        actions: list[Kill | Forward] = []
        for state in self._live():
            if state.termed:
                actions.append(Forward(state.unit.name, signum))
            elif not state.killed:
                state.killed = "the operator asked to stop at once"
                actions.append(Kill(state.unit.name, state.killed))
            state.phase = Phase.STOPPING
        return actions

    # ------------------------------------------------------------------------------------- internals

    def _start(self, state: _State, now: float) -> Start:
        state.phase = Phase.STARTING
        state.starts += 1
        state.started_at = now
        return Start(state.unit.name)

    def _ever_ready_groups(self) -> set[str]:
        """Groups every unit of which has been ready once."""
        groups: dict[str, bool] = {}
        for state in self._states.values():
            groups[state.unit.group] = groups.get(state.unit.group, True) and state.ever_ready
        return {group for group, ready in groups.items() if ready}

    def _live(self) -> Iterable[_State]:
        return (s for s in self._states.values() if s.phase in (Phase.STARTING, Phase.READY, Phase.STOPPING))

    def _begin_stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for state in self._states.values():
            if state.phase in (Phase.WAITING, Phase.BACKOFF):
                state.phase = Phase.DONE

    def _stop_steps(self, now: float) -> list[Action]:
        actions: list[Action] = []
        if self._force_deadline is not None:
            if now >= self._force_deadline:
                for state in self._live():
                    if state.killed != "the stop at once took too long":
                        state.killed = "the stop at once took too long"
                        actions.append(Kill(state.unit.name, state.killed))
        else:
            while self._stage < len(self.stop_order):
                group = self.stop_order[self._stage]
                members = [s for s in self._live() if s.unit.group == group]
                for state in members:
                    if not state.termed and not state.killed:
                        state.termed, state.phase = True, Phase.STOPPING
                        state.deadline = now + state.unit.stop_timeout_s
                        actions.append(Term(state.unit.name))
                    elif state.deadline is not None and now >= state.deadline and not state.killed:
                        state.killed = f"it did not stop within {state.unit.stop_timeout_s:g} s of SIGTERM"
                        actions.append(Kill(state.unit.name, state.killed))
                if members:
                    break
                self._stage += 1
        if not any(True for _ in self._live()):
            self.exit_code = self._final_code
        return actions
