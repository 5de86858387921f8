"""A worker's service rate and a model's lateness (broker/rates.py), driven directly with heartbeat counters."""

from __future__ import annotations

import math

import pytest

from broker.rates import LATENESS_WINDOW_S, PART_WINDOW_S, WINDOW_S, Lateness, ServiceRate
from zbatch.protocol.wire import BatchCounters


def counters(items: int, busy_ms: int) -> BatchCounters:
    """Batches of 10 items."""
    return BatchCounters(batches=items // 10, items=items, busy_ms=busy_ms)


def test_the_first_heartbeat_is_only_a_baseline() -> None:
    """What the worker ran before (its warm-up, another broker's work) is not a measurement."""
    rate = ServiceRate()
    rate.heartbeat(counters(5_000, 100_000), 10.0, None)
    assert rate.per_second(shared=False) is None
    rate.heartbeat(counters(5_100, 101_000), 11.0, None)
    assert rate.per_second(shared=False) == pytest.approx(100.0)


def test_idle_heartbeats_change_nothing_and_old_work_fades_with_new_work() -> None:
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 0.0, None)
    rate.heartbeat(counters(500, 5_000), 1.0, None)  # 100 items/s for 5 s of work
    rate.heartbeat(counters(500, 5_000), 60.0, None)  # idle for a minute
    assert rate.per_second(shared=False) == pytest.approx(100.0)
    rate.heartbeat(counters(1_500, 10_000), 61.0, None)  # then 200 items/s for 5 s of work
    old, new = math.exp(-5.0 / WINDOW_S), 1.0
    assert rate.per_second(shared=False) == pytest.approx((500 * old + 1_000 * new) / (5 * old + 5 * new))


def test_a_saturated_interval_counts_the_gaps_between_batches() -> None:
    """The backlog never emptied: the worker always had its next batch, so the whole interval is the cost."""
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 10.0, None)
    rate.heartbeat(counters(100, 500), 11.0, backlogged_since=9.0)  # 10 batches in 0.5 s busy, a saturated 1 s
    assert rate.per_second(shared=False) == pytest.approx(100.0)
    fresh = ServiceRate()
    fresh.heartbeat(counters(0, 0), 10.0, None)
    fresh.heartbeat(counters(100, 500), 11.0, backlogged_since=10.5)  # the backlog began mid-interval
    assert fresh.per_second(shared=False) == pytest.approx(200.0)


def test_a_saturated_measurement_needs_a_few_batches() -> None:
    """A batch longer than a heartbeat interval: one interval sees none finish, which says little yet."""
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 10.0, None)
    rate.heartbeat(counters(10, 100), 11.0, None)  # one batch of 10 in 0.1 s: 100 items/s busy
    rate.heartbeat(counters(10, 100), 12.0, backlogged_since=10.5)  # a saturated second in which none finished
    assert rate.per_second(shared=False) == pytest.approx(100.0)
    for second in range(13, 30):  # then a batch every 2 s of the clock, each 0.1 s busy: 5 items/s in fact
        done = (second - 11) // 2
        rate.heartbeat(counters(10 + 10 * done, 100 + 100 * done), float(second), backlogged_since=10.5)
    assert rate.per_second(shared=False) == pytest.approx(5.0, rel=0.2)


def test_counters_that_go_back_are_a_restarted_worker_and_a_new_baseline() -> None:
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 0.0, None)
    rate.heartbeat(counters(100, 1_000), 1.0, None)
    rate.heartbeat(counters(10, 50), 2.0, None)
    assert rate.per_second(shared=False) == pytest.approx(100.0)
    rate.heartbeat(counters(110, 1_050), 3.0, None)  # 100 items in 1 s: the same rate, from the new baseline
    assert rate.per_second(shared=False) == pytest.approx(100.0)


def test_a_shared_worker_counts_for_this_brokers_part_of_its_items() -> None:
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 0.0, None)
    rate.answered_ok(30)
    rate.heartbeat(counters(120, 1_000), 1.0, None)
    assert rate.per_second(shared=False) == pytest.approx(120.0)
    assert rate.per_second(shared=True) == pytest.approx(30.0)
    idle = ServiceRate()
    idle.heartbeat(counters(0, 0), 0.0, None)
    idle.heartbeat(counters(120, 1_000), 1.0, None)  # all of it another broker's
    assert idle.per_second(shared=True) is None


def test_lateness_is_the_largest_seen_and_fades() -> None:
    late = Lateness()
    late.observe(-0.5, 0.0)  # early answers do not lengthen anything
    assert late.now(0.0) == 0.0
    late.observe(0.4, 1.0)
    late.observe(0.1, 2.0)
    assert late.now(2.0) == pytest.approx(0.4 * math.exp(-1.0 / LATENESS_WINDOW_S))
    assert late.now(2.0 + 5 * LATENESS_WINDOW_S) < 0.01


def test_a_shared_workers_part_follows_the_other_broker_within_a_few_seconds_of_work() -> None:
    """Half the worker's items were this broker's for a minute; then the other broker dies and all of them
    are.  Two seconds of work later this broker counts on most of the worker, not on half of it for the
    length of the rate's own window."""
    rate = ServiceRate()
    rate.heartbeat(counters(0, 0), 0.0, None)
    items = 0
    for second in range(1, 61):
        items += 100
        rate.answered_ok(50)
        rate.heartbeat(counters(items, 1_000 * second), float(second), None)
    assert rate.per_second(shared=True) == pytest.approx(50.0)
    for second in range(61, 63):  # the other broker is gone: every item is this one's
        items += 100
        rate.answered_ok(100)
        rate.heartbeat(counters(items, 1_000 * second), float(second), None)
    assert rate.per_second(shared=True) == pytest.approx(100.0 * (1 - 0.5 * math.exp(-2.0 / PART_WINDOW_S)))
