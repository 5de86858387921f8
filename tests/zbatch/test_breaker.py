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
        breaker.refused(KEY, 101 - items, DEADLINE_MS, NORMAL_PRIORITY, 10_000 - items)
    assert len(breaker.verdicts(KEY)) == MAX_VERDICTS
    breaker.refused(KEY, 1, DEADLINE_MS, HIGH_PRIORITY, 20_000)  # implies every one before it
    assert len(breaker.verdicts(KEY)) == 1
