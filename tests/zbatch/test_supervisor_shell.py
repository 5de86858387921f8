"""The supervisor's shell over real processes and real signals: FAKE daemons (tests/fake_daemon.py) on the real
daemon lifecycle, supervised by ``python -m tests.supervised``."""

from __future__ import annotations

import itertools
import json
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, spawn, wait_until

FAKE = [sys.executable, "-m", "tests.fake_daemon"]
ORDER = ["gateway", "worker", "broker"]


def unit(name: str, group: str, *args: str, stop_timeout_s: float = 10.0,
         after: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": name, "group": group, "stop_timeout_s": stop_timeout_s, "after": list(after),
            "argv": [*FAKE, *args]}


Supervise = Callable[..., Daemon]


@pytest.fixture
def supervise(log_dir: Path) -> Iterator[Supervise]:
    """Start ``python -m tests.supervised`` over the units given; stopped (SIGTERM) at the end of the test."""
    started: list[Daemon] = []

    def start(units: list[dict[str, Any]], **options: Any) -> Daemon:
        spec = {"units": units, "order": ORDER, "backoff": [0.2, 0.8, 60.0]} | options
        started.append(spawn("tests.supervised", f"supervisor-{len(started)}", log_dir, json.dumps(spec)))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def log_of(daemon: Daemon) -> str:
    return daemon.log_path.read_text(errors="replace")


def times_of(daemon: Daemon, pattern: str) -> list[float]:
    """The timestamps (seconds) of the supervisor's log lines that match ``pattern``."""
    found = []
    for line in log_of(daemon).splitlines():
        if re.search(pattern, line):
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            found.append(stamp.timestamp())
    return found


def until(daemon: Daemon, condition: Callable[[str], object], what: str, timeout_s: float = 30) -> None:
    """Until ``condition(log)`` holds for the supervisor's log; fails at once if the supervisor exits."""
    def check() -> object:
        daemon.check()
        return condition(log_of(daemon))

    wait_until(check, timeout_s, what, daemon.log)


def ready(daemon: Daemon, name: str) -> None:
    until(daemon, lambda log: re.search(rf"{name} \(pid \d+\) is ready", log), f"{name} to be ready")


def test_a_daemon_that_keeps_crashing_at_start_is_restarted_with_growing_delays(supervise: Supervise) -> None:
    daemon = supervise([unit("broker", "broker", "serve"), unit("FAKE-crasher", "worker", "crash", after=("broker",))])
    until(daemon, lambda log: log.count("started FAKE-crasher") >= 5, "five starts of the crasher", 60)
    starts = times_of(daemon, r"started FAKE-crasher")[:5]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    log = log_of(daemon)
    delays = re.findall(r"FAKE-crasher \(pid \d+\) exited unexpectedly with status 1 after [\d.]+ s "
                        r"\((\d+) exits? in a row\): restarting in ([\d.]+) s", log)
    assert delays[:4] == [("1", "0.2"), ("2", "0.4"), ("3", "0.8"), ("4", "0.8")], log
    for gap, delay in zip(gaps, (0.2, 0.4, 0.8, 0.8), strict=True):
        assert gap >= delay, f"restarted after {gap:.2f} s, before its {delay} s delay: {gaps}"
    assert gaps[2] > gaps[0], gaps
    assert len(re.findall(r"started broker", log)) == 1, "the others keep running"
    assert daemon.stop() == 0, daemon.log()


def test_bad_settings_stop_everything_with_status_2(supervise: Supervise) -> None:
    daemon = supervise([unit("broker", "broker", "serve"),
                        unit("gateway", "gateway", "serve", after=("broker",)),
                        unit("FAKE-misconfigured", "worker", "bad-settings", after=("broker",))])
    assert daemon.process.wait(30) == 2, daemon.log()
    log = log_of(daemon)
    assert "FAKE-misconfigured (pid" in log and "exited with status 2" in log
    assert ("not restarting it, and stopping everything: exit status 2 is a zbatch daemon's answer to bad "
            "settings") in log
    assert log.count("started FAKE-misconfigured") == 1
    assert log.index("gateway (pid") < log.rindex("stopping broker")


def test_sigterm_stops_the_groups_in_order_each_after_the_last(supervise: Supervise) -> None:
    daemon = supervise([unit("broker", "broker", "serve", "--drain-s", "0.3"),
                        unit("worker-0", "worker", "serve", "--drain-s", "0.3", after=("broker",)),
                        unit("worker-1", "worker", "serve", "--drain-s", "0.6", after=("broker",)),
                        unit("gateway", "gateway", "serve", "--drain-s", "0.3", after=("broker",))])
    until(daemon, lambda log: "every daemon is ready" in log, "the stack to serve")
    log = log_of(daemon)
    assert log.index("broker (pid") < log.index("started worker-0"), "the rest start once the broker is ready"
    daemon.signal(signal.SIGTERM)
    assert daemon.process.wait(30) == 0, daemon.log()
    stopped = {name: times_of(daemon, rf"{name} \(pid \d+\) stopped with status 0")
               for name in ("gateway", "worker-0", "worker-1", "broker")}
    assert all(len(times) == 1 for times in stopped.values()), log_of(daemon)
    [gateway], [worker_0], [worker_1], [broker] = stopped.values()
    [broker_asked] = times_of(daemon, r"stopping broker")
    [workers_asked, _] = times_of(daemon, r"stopping worker-")
    assert gateway <= workers_asked <= worker_0 <= worker_1 <= broker_asked <= broker
    assert "killing" not in log_of(daemon)
    assert log_of(daemon).splitlines()[-1].endswith("zbatch-supervised stopped")


def test_a_daemon_that_outlasts_its_stop_timeout_is_killed(supervise: Supervise) -> None:
    daemon = supervise([unit("broker", "broker", "serve", "--drain-s", "60", stop_timeout_s=1.0)])
    ready(daemon, "broker")
    asked = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.process.wait(20) == 0
    assert 1.0 <= time.monotonic() - asked < 10
    log = log_of(daemon)
    assert "killing broker (pid" in log and "it did not stop within 1 s of SIGTERM" in log
    assert re.search(r"broker \(pid \d+\) stopped with signal SIGKILL", log), log


def test_a_second_sigint_stops_everything_at_once(supervise: Supervise) -> None:
    daemon = supervise([unit("broker", "broker", "serve", "--drain-s", "60"),
                        unit("gateway", "gateway", "serve", "--drain-s", "60", after=("broker",))])
    until(daemon, lambda log: "every daemon is ready" in log, "the stack to serve")
    daemon.signal(signal.SIGINT)
    wait_until(lambda: "FAKE: draining" in log_of(daemon), 10, "the gateway to drain", daemon.log)
    asked = time.monotonic()
    daemon.signal(signal.SIGINT)
    assert daemon.process.wait(10) == 128 + signal.SIGINT, daemon.log()
    assert time.monotonic() - asked < 5
    log = log_of(daemon)
    assert "SIGINT while stopping: exiting now" in log, "the draining gateway got the second signal"
    assert "killing broker (pid" in log and "the operator asked to stop at once" in log
    assert re.search(r"gateway \(pid \d+\) stopped with status 130", log), log


def test_a_daemon_whose_watchdog_goes_silent_is_killed_and_restarted(supervise: Supervise) -> None:
    daemon = supervise([unit("FAKE-hung", "broker", "serve", "--hang-after-ready")], watchdog_s=1.0)
    until(daemon, lambda log: log.count("started FAKE-hung") >= 2, "the hung daemon to be restarted")
    log = log_of(daemon)
    assert "killing FAKE-hung (pid" in log and "no watchdog ping for 1 s" in log
    assert re.search(r"FAKE-hung \(pid \d+\) exited unexpectedly with signal SIGKILL \(killed: its watchdog "
                     r"went silent\)", log), log
