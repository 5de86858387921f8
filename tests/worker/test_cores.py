"""The cores ledger: the rule with a fake clock, then the shared file itself, between ledgers and processes."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.cores import SHARE_HOLD_S, STALE_WAIT_S, CoreLedger, Other, grant, holders, waiters
from zbatch.testing import wait_until

FAR = float("-inf")


def test_a_lone_worker_takes_every_core() -> None:
    assert grant(8, 8, [], now=10.0, shared_until=FAR) == 8
    assert grant(8, 8, [Other(last_end=9.999)], now=10.0, shared_until=FAR) == 8  # the other ran just before


def test_requests_one_at_a_time_never_share_even_when_they_alternate_between_workers() -> None:
    """The broker hands a lone client's requests to two workers in turn: each finds the other idle."""
    now = 10.0
    for _ in range(100):
        assert grant(2, 2, [Other(last_end=now - 0.003)], now, shared_until=FAR) == 2
        now += 0.015


def test_never_more_than_the_free_cores_and_none_when_none_is_free() -> None:
    assert grant(8, 8, [Other(held=5)], now=10.0, shared_until=FAR) == 3
    assert grant(2, 2, [Other(held=2)], now=10.0, shared_until=FAR) == 0
    assert grant(2, 2, [Other(held=1), Other(held=1)], now=10.0, shared_until=FAR) == 0


def test_workers_that_ran_side_by_side_take_their_share() -> None:
    shared = 10.0 + SHARE_HOLD_S
    assert grant(2, 2, [Other(last_end=9.99)], now=10.0, shared_until=shared) == 1  # active: it comes back
    assert grant(8, 8, [Other(held=4), Other(last_end=9.5)], now=10.0, shared_until=shared) == 2
    assert grant(8, 8, [Other(held=2)], now=10.0, shared_until=shared) == 4
    long_gone = 10.0 - 2 * SHARE_HOLD_S
    assert grant(8, 8, [Other(last_end=long_gone)], now=10.0, shared_until=shared) == 8  # no one else active


def test_waiting_workers_come_first_oldest_first() -> None:
    waiter = Other(waiting_since=9.0)
    assert grant(2, 2, [waiter, Other(held=1)], now=10.0, shared_until=FAR) == 0  # its core is reserved
    assert grant(2, 2, [waiter], now=10.0, shared_until=FAR) == 1
    assert grant(2, 2, [waiter, Other(held=1)], now=10.0, shared_until=FAR, waiting_since=8.0) == 1  # older
    assert grant(4, 4, [Other(waiting_since=9.0, need=4)], now=10.0, shared_until=FAR) == 0  # a warm-up's


def test_a_cap_bounds_the_grant_and_whole_means_all_or_none() -> None:
    assert grant(8, 1, [], now=10.0, shared_until=FAR) == 1
    assert grant(4, 4, [Other(held=1)], now=10.0, shared_until=FAR, whole=True) == 0
    assert grant(4, 4, [Other(last_end=9.99)], now=10.0, shared_until=11.0, whole=True) == 4  # no share


@pytest.fixture
def ledger_path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "cores")


def test_the_file_splits_the_cores_between_ledgers(ledger_path: str) -> None:
    first, second = CoreLedger(ledger_path, 2), CoreLedger(ledger_path, 2)
    try:
        assert first.acquire(2) == 2
        assert holders(ledger_path) == {os.getpid(): 2}
        got: list[int] = []
        waiting = threading.Thread(target=lambda: got.append(second.acquire(2)))
        waiting.start()
        wait_until(lambda: waiters(ledger_path), 5, "the second ledger to wait for cores")
        assert got == []  # both cores are held: it waits
        first.release()
        waiting.join(5)
        assert got == [1] and second.sharing  # it saw the other busy: from now on they split
        assert first.acquire(2) == 1 and first.sharing
        first.release()
        second.release()
    finally:
        first.close()
        second.close()


def hold_and_die(path: str, ready: Any) -> None:
    ledger = CoreLedger(path, 2)
    ledger.acquire(2)
    ready.set()
    time.sleep(60)  # killed long before


def test_a_dead_workers_cores_are_free_at_once(ledger_path: str) -> None:
    ready = multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_and_die, args=(ledger_path, ready))
    holder.start()
    assert ready.wait(30)
    assert holders(ledger_path) == {holder.pid: 2}
    holder.kill()
    holder.join(10)
    ledger = CoreLedger(ledger_path, 2)
    try:
        assert holders(ledger_path) == {}
        assert ledger.acquire(2) == 2
    finally:
        ledger.close()


def test_a_stopped_holder_is_waited_for_at_most_the_stale_wait(ledger_path: str) -> None:
    clock = [100.0]

    def sleep(seconds: float) -> None:
        clock[0] += 1.0  # a second a look: the wait is over in STALE_WAIT_S looks

    holder = CoreLedger(ledger_path, 2)
    waiter = CoreLedger(ledger_path, 2, clock=lambda: clock[0], sleep=sleep)
    try:
        holder.acquire(2)
        assert waiter.acquire(2) == 1
        assert clock[0] >= 100.0 + STALE_WAIT_S
    finally:
        holder.close()
        waiter.close()
