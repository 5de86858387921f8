"""Admission in units of time (broker/admission.py), on the real core with fake frames and a fake clock.

A worker's rate is set the way a real one sets it: heartbeats whose counters
say how many items its batches ran and how long they took (``busy_ms``).
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import BrokerCore
from tests.broker.test_core import (
    MODEL,
    FakeClock,
    client_replies,
    dispatched,
    make_core,
    ready,
    send,
    take,
    worker_reply,
)
from zbatch.protocol import wire
from zbatch.protocol.wire import HIGH_PRIORITY, LOW_PRIORITY, BatchCounters, Heartbeat, Reply, Request, Status


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def heartbeat(core: BrokerCore, worker: bytes, items: int, busy_ms: int, capacity: int | None = None) -> None:
    """The worker's counters: ``items`` run (in batches of 10) in ``busy_ms`` of batches."""
    counters = BatchCounters(items // 10, items, busy_ms=busy_ms)
    core.worker_message(worker, wire.encode_heartbeat(Heartbeat({MODEL: counters}, capacity)))


def measured(core: BrokerCore, worker: bytes, items_per_s: float, *, items: int = 1_000) -> None:
    """The worker reports ``items`` run in the busy time that gives ``items_per_s``, over the two heartbeat
    intervals after a baseline that make a rate established (broker/rates.py)."""
    busy_ms = round(items / items_per_s * 1000)
    heartbeat(core, worker, 0, 0)
    heartbeat(core, worker, items // 2, busy_ms // 2)
    heartbeat(core, worker, items, busy_ms)


def core_at(clock: FakeClock, rate: float = 100.0, capacity: int = 10, **settings: Any) -> BrokerCore:
    """One worker of ``capacity`` items measured at ``rate`` items/s, deadlines of 1 s, memory bounds out of the way,
    and no headroom unless asked for: the rule's own arithmetic."""
    core = make_core(clock, max_backlog=100_000, **({"deadline_headroom": 0.0} | settings))
    ready(core, b"W1", capacity=capacity)
    measured(core, b"W1", rate)
    return core


def fill(core: BrokerCore, requests: int, items: int = 10, prefix: bytes = b"fill", **kw: Any) -> list[Reply]:
    for i in range(requests):
        send(core, prefix + b"%d" % i, items=items, **kw)
    return client_replies(take(core))


def test_a_request_is_refused_only_when_its_predicted_wait_passes_its_deadline(clock: FakeClock) -> None:
    """100 items/s and a 1 s deadline: 10 items on the worker and 80 waiting leave room for one more 10."""
    core = core_at(clock)
    assert fill(core, 9) == []  # 10 in flight, 80 waiting
    send(core, b"fits", items=10)  # (90 ahead + 10) / 100 = 1.0 s
    assert client_replies(take(core)) == []
    send(core, b"late", items=10)  # (100 + 10) / 100 = 1.1 s
    [refused] = client_replies(take(core))
    assert refused.status is Status.OVERLOADED and refused.retry_after_ms == 100
    assert "1.10 s" in refused.message and "100 items ahead" in refused.message


def test_the_headroom_keeps_a_share_of_every_deadline_free(clock: FakeClock) -> None:
    """With 0.2 of a 1 s deadline kept free, 0.8 s of predicted wait is the most admitted, at every deadline."""
    core = core_at(clock, deadline_headroom=0.2)
    assert fill(core, 7) == []  # 10 in flight, 60 waiting
    send(core, b"fits", items=10)  # (70 + 10) / 100 = 0.8 s
    assert client_replies(take(core)) == []
    send(core, b"late", items=10)  # 0.9 s: within the deadline, not within its admitted share
    send(core, b"patient", items=10, timeout_ms=2_000)  # 0.9 s <= 1.6 s
    [refused] = client_replies(take(core))
    assert (refused.request_id, refused.retry_after_ms) == (b"late", 100)
    assert "0.80 s" in refused.message and "share of its deadline" in refused.message


def test_the_deadline_is_the_requests_own(clock: FakeClock) -> None:
    core = core_at(clock)
    fill(core, 5)  # 50 items ahead
    send(core, b"short", items=10, timeout_ms=500)  # 0.6 s
    send(core, b"long", items=10, timeout_ms=5_000)
    [refused] = client_replies(take(core))
    assert (refused.request_id, refused.status, refused.retry_after_ms) == (b"short", Status.OVERLOADED, 100)


def test_a_small_request_fits_where_a_large_one_does_not(clock: FakeClock) -> None:
    core = core_at(clock)
    fill(core, 9)  # 90 ahead
    send(core, b"large", items=20)
    send(core, b"small", items=10)
    [refused] = client_replies(take(core))
    assert refused.request_id == b"large" and refused.retry_after_ms == 100


def test_high_priority_waits_behind_less_work_and_low_priority_keeps_a_reserve(clock: FakeClock) -> None:
    core = core_at(clock, priority_reserve=0.25)
    fill(core, 9)  # 90 ahead at normal priority: the deadline is full for normal requests
    send(core, b"high", items=10, priority=HIGH_PRIORITY)  # only the 10 in flight are ahead of it
    send(core, b"normal", items=20)
    assert [r.request_id for r in client_replies(take(core))] == [b"normal"]
    core = core_at(clock, priority_reserve=0.25)
    fill(core, 7)  # 70 ahead
    send(core, b"low", items=10, priority=LOW_PRIORITY)  # 0.8 s > 0.75 s of its deadline
    send(core, b"normal", items=10)  # 0.8 s <= 1 s
    [refused] = client_replies(take(core))
    assert refused.request_id == b"low" and refused.retry_after_ms == 50


def test_max_queue_ms_bounds_the_wait_below_long_deadlines(clock: FakeClock) -> None:
    core = core_at(clock, max_queue_ms=300, timeout_ms=10_000)
    fill(core, 2)  # 20 ahead
    send(core, b"a", items=10)  # 0.3 s
    send(core, b"b", items=10)  # 0.4 s
    [refused] = client_replies(take(core))
    assert refused.request_id == b"b" and refused.retry_after_ms == 100 and "longest wait" in refused.message


def test_an_idle_model_admits_a_request_larger_than_its_deadline_is_worth(clock: FakeClock) -> None:
    """Nothing ahead: the wait is the request's own work, which a refusal could never shorten."""
    core = core_at(clock)
    send(core, b"big", items=500, timeout_ms=1_000)  # 5 s of work
    assert client_replies(take(core)) == []
    send(core, b"next", items=1)
    [refused] = client_replies(take(core))
    assert refused.request_id == b"next" and refused.status is Status.OVERLOADED


def test_a_client_that_waits_retry_after_gets_in(clock: FakeClock) -> None:
    """The worker drains at its measured rate: after the hint, the refused request fits."""
    core = core_at(clock)
    [refused] = fill(core, 11)  # the eleventh: 100 items ahead
    assert refused.retry_after_ms == 100
    clock.advance(0.1)  # 10 items at 100 items/s: one request of the worker's finishes
    running = next(iter(core.workers[b"W1"].in_flight.values()))
    worker_reply(core, b"W1", running.job_id)
    assert len(dispatched(take(core))) == 1
    send(core, b"again", items=10)
    assert client_replies(take(core)) == []


def test_before_any_rate_is_measured_admission_counts_items(clock: FakeClock) -> None:
    core = make_core(clock, cold_backlog=20, timeout_ms=60_000, max_backlog=1_000)
    ready(core, b"W1", capacity=10)
    assert fill(core, 3) == []  # 10 in flight, 20 waiting
    send(core, b"cold", items=1)
    [refused] = client_replies(take(core))
    assert refused.status is Status.OVERLOADED and refused.retry_after_ms == 1_000
    assert "no established service rate" in refused.message
    measured(core, b"W1", 100.0)  # 30 items ahead: 0.3 s of a 60 s deadline
    assert fill(core, 10, prefix=b"warm") == []


def test_a_worker_that_does_not_report_busy_time_leaves_the_count_in_force(clock: FakeClock) -> None:
    core = make_core(clock, cold_backlog=20, max_backlog=1_000)
    ready(core, b"W1", capacity=10)
    heartbeat(core, b"W1", 0, 0)
    heartbeat(core, b"W1", 500, 0)  # an older worker: items, no busy_ms
    assert core.models[MODEL].rate is None
    assert len(fill(core, 4)) == 1


def test_the_memory_bounds_hold_whatever_the_time_and_time_their_hint(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog=30, timeout_ms=60_000)
    ready(core, b"W1", capacity=10)
    measured(core, b"W1", 100.0)
    fill(core, 4)  # 10 in flight, 30 waiting: the bound
    send(core, b"over", items=5)
    [refused] = client_replies(take(core))
    assert refused.status is Status.OVERLOADED and "memory bounds" in refused.message
    assert refused.retry_after_ms == 50  # 5 items past the bound, at 100 items/s


def test_rates_are_per_busy_second_and_add_up_over_workers(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    ready(core, b"W2")
    measured(core, b"W1", 100.0)
    clock.advance(60)  # an idle minute changes nothing: only busy time counts
    heartbeat(core, b"W1", 1_000, 10_000)
    measured(core, b"W2", 50.0)
    assert core.models[MODEL].rate == pytest.approx(150.0)
    assert core.stats()["models"][MODEL]["service_rate"] == pytest.approx(150.0)
    core.worker_message(b"W2", wire.encode_drain())  # a draining worker takes no new work
    assert core.models[MODEL].rate == pytest.approx(100.0)
    core.remove_worker(b"W1", "silent")
    assert core.models[MODEL].rate is None


def test_a_worker_of_several_brokers_counts_only_for_the_part_this_broker_gets(clock: FakeClock) -> None:
    """It ran 200 items in 2 busy seconds, 50 of them this broker's: 25 items/s are this broker's."""
    core = make_core(clock, max_backlog=1_000)
    ready(core, b"W1", capacity=100)
    heartbeat(core, b"W1", 0, 0, capacity=100)
    for second in (1, 2):
        send(core, b"mine%d" % second, items=25)
        [(_, job)] = dispatched(take(core))
        worker_reply(core, b"W1", job.request_id)
        heartbeat(core, b"W1", 100 * second, 1_000 * second, capacity=100)
    assert core.models[MODEL].rate == pytest.approx(25.0)


def test_stats_show_the_rate_the_wait_and_the_limits(clock: FakeClock) -> None:
    core = core_at(clock, max_queue_ms=700, cold_backlog=64)
    fill(core, 2)  # 10 in flight, 10 waiting
    stats = core.stats()
    model = stats["models"][MODEL]
    assert (model["in_flight_items"], model["backlog_items"]) == (10, 10)
    assert model["predicted_wait_ms"] == 210  # 21 items at 100 items/s, for one more item at normal priority
    assert (stats["limits"]["max_queue_ms"], stats["limits"]["cold_backlog"]) == (700, 64)


def test_a_refusal_is_one_answer_and_leaves_nothing_behind(clock: FakeClock) -> None:
    core = core_at(clock)
    fill(core, 10)
    jobs = len(core.jobs)
    for i in range(1_000):
        core.client_message(b"C", wire.encode_request(Request(b"x%d" % i, MODEL, 10, b"P")))
    replies = client_replies(take(core))
    assert len(replies) == 1_000 and {r.status for r in replies} == {Status.OVERLOADED}
    assert len(core.jobs) == jobs and core.unanswered[b"C"] == 10


def test_answers_later_than_predicted_make_the_predictions_longer_until_they_fade(clock: FakeClock) -> None:
    """Busy time does not see everything: the broker learns how late the answers come and waits that much more."""
    core = core_at(clock)
    send(core, b"first", items=10)  # predicted: answered 0.1 s from now
    [(_, job)] = dispatched(take(core))
    clock.advance(0.4)  # answered 0.3 s late
    worker_reply(core, b"W1", job.request_id)
    take(core)
    assert core.stats()["models"][MODEL]["lateness_ms"] == 300
    fill(core, 7)  # 70 items ahead: 0.7 s of work, 1.0 s with the lateness
    [refused] = fill(core, 1, prefix=b"late")  # 1.1 s > 1 s
    assert refused.retry_after_ms == 100
    clock.advance(120)  # four times the fading time: the lateness is all but forgotten, the work has not moved
    assert fill(core, 1, prefix=b"faded") == []


def test_while_the_backlog_never_empties_a_workers_gaps_between_batches_count(clock: FakeClock) -> None:
    """Half a second of batches in each second of backlog: the worker serves 100 items/s, not 200, until its
    work without a backlog has outweighed those seconds."""
    core = make_core(clock, max_backlog=1_000, timeout_ms=60_000)
    ready(core, b"W1", capacity=10)
    fill(core, 5)  # 10 in flight, 40 waiting from now on
    heartbeat(core, b"W1", 0, 0)
    for second in (1, 2):
        clock.advance(1.0)
        heartbeat(core, b"W1", 100 * second, 500 * second)
    assert core.models[MODEL].rate == pytest.approx(100.0)
    for i in range(1, 5):  # the backlog empties: gaps are idleness from now on, not cost
        core.client_message(b"C", wire.encode_cancel(b"fill%d" % i))
    items, busy_ms = 200, 1_000
    for _ in range(40):
        clock.advance(1.0)
        items, busy_ms = items + 100, busy_ms + 500
        heartbeat(core, b"W1", items, busy_ms)
    assert core.models[MODEL].rate == pytest.approx(200.0)
