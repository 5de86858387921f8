"""A cold start on a fake clock: how an 88 s ``retry_after`` came out of one slow first batch, and why not now.

Issue 38's numbers: four GPU workers of capacity 256 registering 1.1 s apart, 512 clients of one text
each, a 30 s deadline.  The broker refused 78 requests in the first second, with ``retry_after`` up
to 88 s, and every gateway's breaker then held that verdict.  The broker's side of it, replayed here
on the real core: the first worker's first measured heartbeat interval held one batch of five items
that took 1.1 s (a first batch that ran slow: a shape its warm-up did not cover, a GPU that idled),
a rate of 4.5 items/s from one batch.  At that rate the 507 items on the worker and waiting are a
112 s wait, 88 s past the 24 s a 30 s deadline may fill; and the next three workers, registered but
not measured yet, counted for nothing.
"""

from __future__ import annotations

import pytest

from broker.core import BrokerCore
from tests.broker.test_admission import heartbeat
from tests.broker.test_core import FakeClock, client_replies, dispatched, make_core, ready, send, take, worker_reply
from zbatch.protocol.wire import Status

CAPACITY = 256
CLIENTS = 512
DEADLINE_MS = 30_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cold_core(clock: FakeClock) -> BrokerCore:
    """The shipped admission settings (a 30 s deadline, the cold count, the headroom) and a first worker with
    every client's first request: 256 on the worker, 256 waiting."""
    core = make_core(clock, timeout_ms=DEADLINE_MS, max_backlog=262_144, cold_backlog=512,
                     no_worker_grace_ms=2_000)
    ready(core, b"W1", capacity=CAPACITY)
    heartbeat(core, b"W1", 640, 900)  # the baseline: the warm-up's batches, which say nothing
    for client in range(CLIENTS):
        send(core, b"first", client=b"C%d" % client)
    assert len(dispatched(take(core))) == CAPACITY
    return core


def first_interval_with_one_slow_batch(core: BrokerCore, clock: FakeClock) -> None:
    """A second later: one batch of five items in 1.1 s (it began before the baseline); its five clients
    are answered and send again."""
    clock.advance(1.0)
    heartbeat(core, b"W1", 645, 2_000)
    for job in list(core.workers[b"W1"].in_flight.values())[:5]:
        worker_reply(core, b"W1", job.job_id)
    take(core)
    for client in range(5):
        send(core, b"second", client=b"C%d" % client)


def test_one_slow_first_batch_is_not_evidence_enough_to_refuse(clock: FakeClock) -> None:
    """Before: ``overloaded`` with ``retry_after_ms`` 87,760 (a 111.8 s predicted wait less the 24 s
    allowed) for each of the five.  Now one interval and one batch are a weak estimate: the cold count
    rules, and 256 items waiting are within it."""
    core = cold_core(clock)
    first_interval_with_one_slow_batch(core, clock)
    assert client_replies(take(core)) == []
    assert core.models["m"].rate is None


def test_a_worker_with_free_credit_and_nothing_waiting_admits_whatever_the_rate_says(clock: FakeClock) -> None:
    """The worst case for the rule of time: the first worker's slow start lasts long enough to establish a
    rate of 10 items/s (three seconds of it).  The second worker registers and takes all that waits; the
    first answers five requests.  A request that comes then would wait 25.4 s at that rate (the second worker
    counted at the first's), past the 24 s allowed, but a worker has credit for it and nothing waits: it is
    admitted, and dispatched at once."""
    core = cold_core(clock)
    for second in range(1, 4):
        clock.advance(1.0)
        heartbeat(core, b"W1", 640 + 10 * second, 900 + 1_000 * second)
    assert core.models["m"].rate == pytest.approx(10.0)
    waiting = core.models["m"].backlog_items
    ready(core, b"W2", capacity=CAPACITY)
    assert len(dispatched(take(core))) == waiting and core.models["m"].backlog_items == 0
    for job in list(core.workers[b"W1"].in_flight.values())[:5]:
        worker_reply(core, b"W1", job.job_id)
    take(core)
    assert core.models["m"].predicted_wait_s(1, 1, clock.now) == pytest.approx(25.4)
    send(core, b"next", client=b"C9")
    out = take(core)
    assert client_replies(out) == [] and len(dispatched(out)) == 1
    send(core, b"full", client=b"C10", items=6)  # room for five: it waits, and the wait is too long
    [refused] = client_replies(take(core))
    assert refused.status is Status.OVERLOADED and refused.retry_after_ms is not None


def test_a_registered_worker_without_a_measurement_counts_at_the_mean_rate(clock: FakeClock) -> None:
    """Once the first worker's rate is established, a second one registered and not measured yet counts at
    that rate, not at nothing: the model's rate doubles the moment it registers."""
    core = cold_core(clock)
    for second in range(1, 4):  # three seconds of backlog, 1,000 items in each: 1,000 items/s
        clock.advance(1.0)
        heartbeat(core, b"W1", 640 + 1_000 * second, 900 + 400 * second)
    assert core.models["m"].rate == pytest.approx(1_000.0)
    ready(core, b"W2", capacity=CAPACITY)
    assert core.models["m"].rate == pytest.approx(2_000.0)
    assert Status.OVERLOADED not in {reply.status for reply in client_replies(take(core))}
