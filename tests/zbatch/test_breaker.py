"""The overload breaker (zbatch/client/breaker.py), driven directly: no sockets, a fake clock."""

from __future__ import annotations

import pytest

from zbatch.client.breaker import MAX_VERDICTS, OverloadBreaker
from zbatch.protocol.wire import HIGH_PRIORITY, LOW_PRIORITY, NORMAL_PRIORITY

KEY = (0, "model")
DEADLINE_MS = 5_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def refused_32(clock: FakeClock, retry_after_ms: int = 800) -> OverloadBreaker:
    """The broker refused a 32-text request, 5 s deadline, normal priority, room expected in ``retry_after_ms``."""
    breaker = OverloadBreaker(clock)
    breaker.refused(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY, retry_after_ms)
    return breaker


def test_nothing_is_refused_here_before_the_broker_refuses(clock: FakeClock) -> None:
    assert OverloadBreaker(clock).refusing(KEY, 1_000, 1, LOW_PRIORITY) is None


def test_a_refused_32_text_request_does_not_turn_away_a_one_text_request(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    assert breaker.refusing(KEY, 1, DEADLINE_MS, NORMAL_PRIORITY) is None
    assert breaker.refusing(KEY, 31, DEADLINE_MS, NORMAL_PRIORITY) is None


def test_what_the_broker_would_refuse_too_is_refused_here_with_the_time_left(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) == 800
    clock.now += 0.3
    assert breaker.refusing(KEY, 64, 1_000, LOW_PRIORITY) == 500  # larger, less patient, lower: refused too


def test_a_longer_deadline_or_a_higher_priority_goes_to_the_broker(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    assert breaker.refusing(KEY, 32, DEADLINE_MS + 1, NORMAL_PRIORITY) is None
    assert breaker.refusing(KEY, 32, DEADLINE_MS, HIGH_PRIORITY) is None


def test_a_verdict_ends_when_the_broker_expects_room(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    clock.now += 0.8
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) is None
    assert breaker.verdicts(KEY) == []


def test_brokers_and_models_keep_their_own_verdicts(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    assert breaker.refusing((1, "model"), 32, DEADLINE_MS, NORMAL_PRIORITY) is None
    assert breaker.refusing((0, "other"), 32, DEADLINE_MS, NORMAL_PRIORITY) is None


def test_a_refusal_without_a_hint_leaves_no_verdict(clock: FakeClock) -> None:
    breaker = OverloadBreaker(clock)
    breaker.refused(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY, None)
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) is None


def test_the_soonest_room_of_the_covering_verdicts_is_the_hint(clock: FakeClock) -> None:
    breaker = refused_32(clock, retry_after_ms=800)
    breaker.refused(KEY, 8, DEADLINE_MS, NORMAL_PRIORITY, 300)  # a smaller request refused, sooner room
    assert breaker.refusing(KEY, 8, DEADLINE_MS, NORMAL_PRIORITY) == 300
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) == 300  # the 8-text verdict covers it too
    assert breaker.refusing(KEY, 4, DEADLINE_MS, NORMAL_PRIORITY) is None


def test_verdicts_stay_few_whatever_the_broker_says(clock: FakeClock) -> None:
    breaker = OverloadBreaker(clock)
    for items in range(1, 100):  # none implies another: each covers smaller and smaller sizes, each shorter
        breaker.refused(KEY, 101 - items, DEADLINE_MS, NORMAL_PRIORITY, 999 - items)
    assert len(breaker.verdicts(KEY)) == MAX_VERDICTS
    breaker.refused(KEY, 1, DEADLINE_MS, HIGH_PRIORITY, 20_000)  # implies every one before it
    assert len(breaker.verdicts(KEY)) == 1


# ---------------------------------------------------------------- a verdict never outlives its evidence


def test_a_verdict_of_90_s_ends_within_the_horizon_without_confirmation(clock: FakeClock) -> None:
    """The broker said 90 s; nothing it said since confirms it: the verdict stands one horizon, no more, and
    the time it tells callers to wait is never more than what it has left."""
    breaker = OverloadBreaker(clock, horizon_s=1.0)
    breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
    assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) == 1_000
    clock.now += 0.999
    assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) == 1
    clock.now += 0.001
    assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) is None
    assert breaker.verdicts(KEY) == []


def test_a_verdict_the_broker_confirms_continues_one_horizon_past_each_refusal(clock: FakeClock) -> None:
    breaker = OverloadBreaker(clock, horizon_s=1.0)
    breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
    for _ in range(10):  # a probe every 0.8 s, refused each time: still overloaded after 8 s
        clock.now += 0.8
        assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) == 200
        breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
    assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) == 1_000
    clock.now += 1.0  # no more refusals: it ends
    assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) is None


def test_probes_get_through_one_per_interval_while_verdicts_hold(clock: FakeClock) -> None:
    """Half-open: a request the verdicts cover may go to the broker as their probe, a few times a horizon."""
    breaker = OverloadBreaker(clock, horizon_s=1.0)
    breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
    probes = []
    for step in range(100):  # 100 covered requests over one horizon
        assert breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) is not None
        if breaker.probe(KEY):
            probes.append(step)
        clock.now += 0.00999
    assert probes == [26, 52, 78] and breaker.probe_every_s == 0.25  # the first an interval after the refusal
    assert breaker.probe((1, "model")) and breaker.probe((0, "other"))  # each key has its own


def test_an_admission_the_verdict_covers_ends_it(clock: FakeClock) -> None:
    """The broker admitted a request at least as hard as the refused one, sent after the refusal: the verdict
    is stale.  An admission of an easier request, or of one sent before the verdict, says nothing of it."""
    breaker = refused_32(clock, retry_after_ms=800)
    made = clock.now
    breaker.admitted(KEY, 8, DEADLINE_MS, NORMAL_PRIORITY, made + 0.1)  # easier: smaller
    breaker.admitted(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY, made - 0.1)  # sent before the refusal
    breaker.admitted((1, "model"), 32, DEADLINE_MS, NORMAL_PRIORITY, made + 0.1)  # another broker's
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) == 800
    breaker.admitted(KEY, 64, 1_000, LOW_PRIORITY, made)  # harder in every way, sent as it was refused
    assert breaker.refusing(KEY, 32, DEADLINE_MS, NORMAL_PRIORITY) is None and breaker.verdicts(KEY) == []


def test_the_verdicts_of_a_broker_that_died_go_with_it(clock: FakeClock) -> None:
    breaker = refused_32(clock)
    breaker.refused((1, "model"), 32, DEADLINE_MS, NORMAL_PRIORITY, 800)
    breaker.forget(lambda key: key == KEY)
    assert breaker.verdicts(KEY) == [] and len(breaker.verdicts((1, "model"))) == 1


def test_many_gateway_processes_each_with_its_own_breaker_all_recover(clock: FakeClock) -> None:
    """64 clients (gateway processes) of one broker, each with its breaker, each refused with 90 s at once.
    The broker is full for 5 s, then has room.  Each client sends a request every 10 ms as its callers do;
    what its breaker lets through reaches the broker, which refuses (90 s again) while full and admits
    after.  Every client is through within a probe interval of the room, none later than a horizon."""
    broker_full_until = clock.now + 5.0
    breakers = [OverloadBreaker(clock, horizon_s=1.0) for _ in range(64)]
    for breaker in breakers:
        breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
    last_refused_here = [clock.now] * len(breakers)
    reached_broker_while_full = 0
    while clock.now < broker_full_until + 2.0:
        clock.now = round(clock.now + 0.01, 6)
        for number, breaker in enumerate(breakers):
            if breaker.refusing(KEY, 1, 30_000, NORMAL_PRIORITY) is not None and not breaker.probe(KEY):
                last_refused_here[number] = clock.now
                continue
            if clock.now < broker_full_until:
                reached_broker_while_full += 1
                breaker.refused(KEY, 1, 30_000, NORMAL_PRIORITY, 90_000)
            else:
                breaker.admitted(KEY, 1, 30_000, NORMAL_PRIORITY, clock.now)
    assert max(last_refused_here) <= broker_full_until + breakers[0].probe_every_s
    assert reached_broker_while_full <= 64 * 5.0 / breakers[0].probe_every_s + 64  # probes, not a flood
    assert all(breaker.verdicts(KEY) == [] for breaker in breakers)
