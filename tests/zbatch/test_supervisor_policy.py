"""The supervisor's rules (zbatch/supervisor/policy.py) on a fake clock: start order, restarts and their backoff,
giving up, the watchdog, the stop in order and the stop at once."""

from __future__ import annotations

import signal
from collections.abc import Sequence

import pytest

from zbatch.hub import CONFIG_EXIT_CODE
from zbatch.supervisor.policy import (
    FORCE_GRACE_S,
    Action,
    Backoff,
    ExitStatus,
    Forward,
    Kill,
    Phase,
    Start,
    Supervision,
    Term,
    Unit,
)

ORDER = ("gateway", "worker", "broker")
KILLED = -signal.SIGKILL
BACKOFF = Backoff(first_s=1.0, max_s=8.0, reset_after_s=60.0)


def stack(workers: int = 2, **options: object) -> Supervision:
    units = [Unit("broker", "broker", 20.0)]
    units += [Unit(f"worker-{i}", "worker", 20.0, after=("broker",)) for i in range(workers)]
    units += [Unit("gateway", "gateway", 42.0, after=("broker",))]
    return Supervision(units, ORDER, **({"backoff": BACKOFF} | options))  # type: ignore[arg-type]


def start_all(s: Supervision, now: float = 0.0) -> None:
    """Start the stack and make every unit ready."""
    for action in s.tick(now):
        assert isinstance(action, Start)
        s.ready(action.unit, now)
    for action in s.tick(now):
        assert isinstance(action, Start)
        s.ready(action.unit, now)
    assert s.stack_served


def names(actions: Sequence[Action]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.unit) for a in actions]


# --------------------------------------------------------------------------------------------- start

def test_brokers_start_first_and_the_rest_once_every_broker_is_ready() -> None:
    units = [Unit("broker-0", "broker", 1), Unit("broker-1", "broker", 1),
             Unit("worker-0", "worker", 1, after=("broker",)), Unit("gateway", "gateway", 1, after=("broker",))]
    s = Supervision(units, ORDER)
    assert names(s.tick(0)) == [("Start", "broker-0"), ("Start", "broker-1")]
    assert s.tick(0.5) == []
    s.ready("broker-0", 1)
    assert s.tick(1) == [], "one broker of two is not enough"
    s.ready("broker-1", 2)
    assert names(s.tick(2)) == [("Start", "worker-0"), ("Start", "gateway")]
    assert s.tick(3) == []


def test_the_stack_serves_once_every_unit_is_ready_and_says_so_once() -> None:
    s = stack(workers=1)
    s.tick(0)
    first = s.ready("broker", 1)
    assert first is not None and not first.stack_serves and first.starts == 1 and first.down_s is None
    s.tick(1)
    s.ready("worker-0", 5)
    last = s.ready("gateway", 6)
    assert last is not None and last.stack_serves and s.stack_served
    assert s.ready("gateway", 7) is None, "a repeated READY=1 changes nothing"


# --------------------------------------------------------------------------------------------- restarts

def test_an_unexpected_exit_is_restarted_with_a_doubling_delay_up_to_the_cap() -> None:
    s = stack()
    start_all(s)
    now, delays = 100.0, []
    for _ in range(6):
        exited = s.exited("worker-1", 1, now)
        assert not exited.expected and exited.restart_in_s is not None and not exited.fatal
        delays.append(exited.restart_in_s)
        assert s.phase("worker-1") is Phase.BACKOFF
        assert s.tick(now + exited.restart_in_s - 0.01) == [], "not before its delay"
        assert s.next_wakeup() == pytest.approx(now + exited.restart_in_s)
        now += exited.restart_in_s
        assert s.tick(now) == [Start("worker-1")]
        s.started("worker-1", now)
        now += 0.5  # crashes at start: never ready
    assert delays == [1, 2, 4, 8, 8, 8]
    assert s.phase("worker-0") is Phase.READY, "the others keep serving"


def test_a_clean_exit_and_a_signal_are_unexpected_too() -> None:
    s = stack()
    start_all(s)
    clean = s.exited("worker-0", 0, 10)  # kill -TERM from outside: it drained and exited 0
    assert not clean.expected and clean.restart_in_s == 1.0
    killed = s.exited("worker-1", KILLED, 10)
    assert str(killed.status) == "signal SIGKILL" and killed.restart_in_s == 1.0


def test_the_delay_starts_over_once_a_unit_was_ready_long_enough() -> None:
    s = stack()
    start_all(s)
    assert s.exited("worker-0", 1, 10).restart_in_s == 1
    s.tick(11)
    s.ready("worker-0", 12)
    assert s.exited("worker-0", 1, 20).restart_in_s == 2, "ready for 8 s only: the second exit in a row"
    s.tick(22)
    ready = s.ready("worker-0", 25)
    assert ready is not None and ready.down_s == 5 and ready.starts == 3 and not ready.stack_serves
    assert s.exited("worker-0", 1, 25 + 60).restart_in_s == 1, "ready for 60 s: the count starts over"


def test_a_restart_waits_for_nothing() -> None:
    s = stack()
    start_all(s)
    s.exited("broker", KILLED, 10)
    s.exited("worker-0", KILLED, 10)
    assert names(s.tick(11)) == [("Start", "broker"), ("Start", "worker-0")]


# --------------------------------------------------------------------------------------------- giving up

def test_bad_settings_at_start_stop_everything_with_status_2() -> None:
    s = stack(workers=1)
    s.tick(0)
    s.ready("broker", 1)
    s.tick(1)
    s.ready("gateway", 2)
    exited = s.exited("worker-0", 2, 3)
    assert exited.fatal and exited.restart_in_s is None
    assert s.stopping
    assert names(s.tick(3)) == [("Term", "gateway")]
    s.exited("gateway", 0, 4)
    assert names(s.tick(4)) == [("Term", "broker")]
    s.exited("broker", 0, 5)
    assert s.tick(5) == [] and s.exit_code == 2


def test_status_2_after_a_unit_was_ready_is_an_ordinary_exit() -> None:
    s = stack()
    start_all(s)
    exited = s.exited("worker-0", 2, 10)
    assert not exited.fatal and exited.restart_in_s == 1


def test_a_model_that_cannot_be_had_at_start_stops_everything_with_status_78() -> None:
    """Exit 78 (zbatch.hub: no such model, no access, not cached while offline) before the stack served once:
    the other worker, still loading, is stopped too, and the supervisor exits 78."""
    s = stack(workers=2)
    s.tick(0)
    s.ready("broker", 1)
    s.tick(1)
    s.ready("gateway", 2)
    exited = s.exited("worker-0", CONFIG_EXIT_CODE, 3)
    assert exited.fatal and "model" in exited.fatal and exited.restart_in_s is None and not exited.given_up
    assert s.phase("worker-0") is Phase.DONE and s.next_wakeup() is None, "no restart is due"
    assert names(s.tick(3)) == [("Term", "gateway")]
    s.exited("gateway", 0, 4)
    assert names(s.tick(4)) == [("Term", "worker-1")]
    s.exited("worker-1", 0, 5)
    assert names(s.tick(5)) == [("Term", "broker")]
    s.exited("broker", 0, 6)
    assert s.tick(6) == [] and s.exit_code == CONFIG_EXIT_CODE


def test_a_model_that_cannot_be_had_once_served_leaves_that_worker_stopped_and_the_rest_serving() -> None:
    """The stack served, then a worker's restart found its model gone: it stays down, and nothing else changes
    (a restart would fail the same way; the others still serve what they loaded)."""
    s = stack(workers=2)
    start_all(s)
    s.exited("worker-0", KILLED, 100)
    assert names(s.tick(101)) == [("Start", "worker-0")]
    exited = s.exited("worker-0", CONFIG_EXIT_CODE, 102)
    assert exited.given_up and not exited.fatal and exited.restart_in_s is None
    assert s.phase("worker-0") is Phase.FAILED and not s.stopping
    assert s.next_wakeup() is None and s.tick(10_000) == [], "never restarted"
    assert s.counts() == {Phase.READY: 3, Phase.FAILED: 1}
    s.stop(10_001)
    assert names(s.tick(10_001)) == [("Term", "gateway")], "the stop skips it"
    for unit, now in (("gateway", 10_002), ("worker-1", 10_003), ("broker", 10_004)):
        s.exited(unit, 0, now)
        s.tick(now)
    assert s.exit_code == 0


def test_fail_fast_fails_the_start_with_the_units_status_but_restarts_once_served() -> None:
    units = [Unit(f"gateway-{i}", "gateway", 10) for i in range(2)]
    s = Supervision(units, ("gateway",), fail_fast=True)
    s.tick(0)
    s.ready("gateway-0", 1)
    exited = s.exited("gateway-1", 1, 1)
    assert exited.fatal
    assert s.tick(1) == [Term("gateway-0")]
    s.exited("gateway-0", 0, 2)
    s.tick(2)
    assert s.exit_code == 1

    s = Supervision(units, ("gateway",), fail_fast=True)
    s.tick(0)
    s.exited("gateway-0", KILLED, 1)
    s.tick(1)
    s.exited("gateway-1", 0, 1.5)
    s.tick(2)
    assert s.exit_code == 128 + signal.SIGKILL

    s = Supervision(units, ("gateway",), fail_fast=True)
    s.tick(0)
    s.ready("gateway-0", 1)
    s.ready("gateway-1", 1)
    exited = s.exited("gateway-1", KILLED, 5)
    assert not exited.fatal and exited.restart_in_s == 1


# --------------------------------------------------------------------------------------------- watchdog

def test_a_ready_unit_that_stops_pinging_is_killed_and_restarted() -> None:
    s = stack(watchdog_s=30.0)
    start_all(s)
    for unit in ("broker", "worker-1", "gateway"):
        s.pinged(unit, 20)
    assert s.tick(29.9) == []
    assert s.next_wakeup() == 30, "worker-0 has not pinged since it was ready at 0"
    assert s.tick(30) == [Kill("worker-0", "no watchdog ping for 30 s")]
    assert s.tick(31) == [], "killed once"
    exited = s.exited("worker-0", KILLED, 31)
    assert exited.watchdog and exited.restart_in_s == 1
    silent = Kill("broker", "no watchdog ping for 30 s")
    assert s.tick(50) == [silent, Start("worker-0"), Kill("worker-1", silent.reason), Kill("gateway", silent.reason)]


def test_no_watchdog_before_ready_or_without_one() -> None:
    s = stack(watchdog_s=30.0)
    s.tick(0)
    assert s.tick(1000) == [], "a broker still starting is not held to the watchdog"
    s = stack()
    start_all(s)
    assert s.tick(1e6) == [] and s.next_wakeup() is None


# --------------------------------------------------------------------------------------------- stop

def test_stop_goes_gateways_then_workers_then_brokers_each_within_its_timeout() -> None:
    s = stack()
    start_all(s)
    s.stop(100)
    assert s.tick(100) == [Term("gateway")]
    assert s.next_wakeup() == 142
    assert s.tick(141) == []
    assert s.tick(142) == [Kill("gateway", "it did not stop within 42 s of SIGTERM")]
    stopped = s.exited("gateway", KILLED, 142.1)
    assert stopped.expected and stopped.restart_in_s is None
    assert s.tick(142.1) == [Term("worker-0"), Term("worker-1")]
    s.exited("worker-0", 0, 143)
    assert s.tick(143) == [], "the brokers wait for every worker"
    s.exited("worker-1", 0, 144)
    assert s.tick(144) == [Term("broker")]
    s.exited("broker", 0, 145)
    assert s.tick(145) == [] and s.exit_code == 0


def test_units_waiting_to_start_or_restart_are_not_started_once_stopping() -> None:
    s = stack()
    s.tick(0)  # the broker starts; the rest wait for it
    s.stop(1)
    assert s.tick(1) == [Term("broker")]
    s.exited("broker", 0, 2)
    assert s.tick(100) == [] and s.exit_code == 0

    s = stack()
    start_all(s)
    s.exited("worker-0", 1, 10)
    s.stop(10.5)
    assert Start("worker-0") not in s.tick(11)
    assert s.phase("worker-0") is Phase.DONE


def test_a_unit_that_exits_on_its_own_during_the_stop_is_not_restarted() -> None:
    s = stack()
    start_all(s)
    s.stop(10)
    s.tick(10)
    exited = s.exited("broker", 1, 11)  # while the gateway drains
    assert not exited.expected and exited.restart_in_s is None
    s.exited("gateway", 0, 12)
    assert s.tick(12) == [Term("worker-0"), Term("worker-1")]


def test_stop_at_once_forwards_to_the_draining_and_kills_the_rest() -> None:
    s = stack()
    start_all(s)
    s.stop(10)
    s.tick(10)
    actions = s.stop_at_once(11, signal.SIGINT)
    assert actions == [Kill("broker", "the operator asked to stop at once"),
                       Kill("worker-0", "the operator asked to stop at once"),
                       Kill("worker-1", "the operator asked to stop at once"),
                       Forward("gateway", signal.SIGINT)]
    for unit in ("broker", "worker-0", "worker-1"):
        s.exited(unit, KILLED, 11.1)
    assert s.tick(11.5) == []
    assert s.next_wakeup() == 11 + FORCE_GRACE_S
    assert s.tick(11 + FORCE_GRACE_S) == [Kill("gateway", "the stop at once took too long")]
    s.exited("gateway", KILLED, 13.5)
    s.tick(13.5)
    assert s.exit_code == 128 + signal.SIGINT


# --------------------------------------------------------------------------------------------- building blocks

def test_backoff_doubles_to_its_cap_and_checks_its_bounds() -> None:
    assert [Backoff(0.5, 30).delay_s(n) for n in (1, 2, 3, 7, 8, 10_000)] == [0.5, 1, 2, 30, 30, 30]
    assert Backoff(0, 0).delay_s(5) == 0
    with pytest.raises(ValueError, match="first <= max"):
        Backoff(10, 5)


def test_exit_statuses_read_as_codes_or_signals() -> None:
    assert str(ExitStatus(0)) == "status 0" and ExitStatus(0).signum is None
    assert str(ExitStatus(-9)) == "signal SIGKILL" and ExitStatus(-9).signum == 9
    assert str(ExitStatus(-200)) == "signal 200"


def test_a_stack_that_cannot_be_stopped_in_order_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks worker"):
        Supervision([Unit("w", "worker", 1)], ("gateway",))
    with pytest.raises(ValueError, match="two units are named 'w'"):
        Supervision([Unit("w", "worker", 1), Unit("w", "worker", 1)], ORDER)
    with pytest.raises(ValueError, match="starts after broker"):
        Supervision([Unit("w", "worker", 1, after=("broker",))], ORDER)
