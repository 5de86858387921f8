"""Many idle ZeroMQ connections to a real broker started under systemd's default soft limit on open files.

A broker that kept the soft limit of 1024 could accept no new client past
about a thousand connections, and libzmq retried the failing accept in a
busy loop.  Every daemon raises its soft limit to the hard limit at start
(zbatch/runtime/daemon.py): this broker must, and must then hold the idle
connections, answer new clients and stay idle itself.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, broker_stats, start_broker, wait_until
from tests.slow_peers import (
    SYSTEMD_DEFAULT_FILES,
    IdleZmq,
    cpu_seconds,
    file_limit,
    open_file_limit,
    open_files,
    raise_open_files,
)

IDLE = 1100  # past the default soft limit
WINDOW_S = 2.0  # new clients keep coming for this long while the CPU is measured
SLACK = 8  # files the broker may close of its own while the idle peers connect
BUSY_LOOP = 0.5  # a share of one core the idle connections and the new clients (one a poll) come nowhere near


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Daemon]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 * IDLE + 1024:
        pytest.skip(f"the hard limit on open files, {hard}, leaves no room for {IDLE} connections on each side")
    raise_open_files(2 * IDLE + 1024)  # each idle peer here is a socket and its mailbox
    with open_file_limit(SYSTEMD_DEFAULT_FILES):
        daemon = start_broker(tmp_path)
    yield daemon
    daemon.stop()


def test_idle_connections_past_the_default_file_limit_lock_no_client_out(broker: Daemon) -> None:
    soft, hard = file_limit(broker.pid)
    assert soft == hard, f"the broker kept a soft limit of {soft} open files (hard: {hard})"
    assert f"open files: the limit is {hard}, raised from {SYSTEMD_DEFAULT_FILES}" in broker.log()
    before = open_files(broker.pid)
    with IdleZmq(broker.frontend, IDLE):
        # Give or take a few: connections of the start's statistics clients may close meanwhile.
        wait_until(lambda: open_files(broker.pid) >= before + IDLE - SLACK, 60,
                   f"the broker to hold {IDLE} more connections", broker.log)
        used, started = cpu_seconds(broker.pid), time.monotonic()
        answered: list[float] = []

        def a_new_client_answered_through_the_window() -> bool:
            broker.check()
            assert broker_stats(broker.frontend) is not None, "a new client got no answer"
            answered.append(time.monotonic())
            return answered[-1] - started >= WINDOW_S

        # A new client at each of the harness's polls: the broker's own work for them stays a sliver of a core,
        # and a busy loop takes a whole one whatever the clients do.
        wait_until(a_new_client_answered_through_the_window, WINDOW_S + 60, "new clients through the window")
        busy = (cpu_seconds(broker.pid) - used) / (time.monotonic() - started)
    assert busy < BUSY_LOOP, f"the broker used {busy:.0%} of a core to hold idle connections and answer " \
                             f"{len(answered)} new clients: a busy loop"
    assert broker_stats(broker.frontend) is not None
    broker.check()
