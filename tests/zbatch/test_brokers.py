"""The client's view of several brokers, driven by a fake clock: choice, liveness, rejoin (zbatch/client/brokers.py)."""

from __future__ import annotations

from zbatch.client.brokers import BrokerSet


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def brokers(clock: FakeClock, count: int = 2) -> BrokerSet:
    return BrokerSet([f"tcp://b{i}:5555" for i in range(count)], clock, heartbeat_s=1.0, liveness=3)


def test_the_broker_with_fewest_items_outstanding_comes_first_and_ties_take_turns() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    firsts = [fleet.order()[0] for _ in range(4)]
    assert sorted(firsts) == [0, 0, 1, 1]  # an idle client still spreads
    fleet[0].outstanding = 5
    fleet[1].outstanding = 2
    assert fleet.order() == [1, 0]


def test_a_silent_broker_dies_after_interval_times_liveness_and_comes_back_when_heard() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    clock.now += 2.0
    fleet.heard(1)
    assert fleet.silent() == [] and fleet.next_wakeup() == 100.0  # the first heartbeat is due at once
    clock.now += 1.01
    assert fleet.silent() == [0]
    assert fleet.order() == [1] and fleet[0].deaths == 1
    assert fleet.silent() == []  # dead once
    assert fleet[0].why == "after 3.01 s without an answer to heartbeats"
    clock.now += 0.5
    assert fleet[0].obituary(clock.now) == "was given up 0.50 s ago, after 3.01 s without an answer to heartbeats"
    assert fleet.heard(0) is True  # back
    assert fleet.heard(0) is False
    assert sorted(fleet.order()) == [0, 1]


def test_a_late_look_gives_a_broker_up_late_and_says_how_late() -> None:
    """Death is noticed when the client looks (its event loop's timer): a loaded host that keeps the loop
    from running makes the silence measured at death longer than the liveness, and the obituary says so."""
    clock = FakeClock()
    fleet = brokers(clock)
    clock.now += 4.2  # the timer due at 3 s ran 1.2 s late
    assert fleet.silent() == [0, 1]
    assert fleet[0].why == "after 4.20 s without an answer to heartbeats"


def test_heartbeats_are_due_every_interval() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    assert fleet.heartbeat_due() and not fleet.heartbeat_due()
    clock.now += 0.99
    assert not fleet.heartbeat_due()
    clock.now += 0.02
    assert fleet.heartbeat_due()


def test_a_lost_connection_is_a_death_at_once() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    assert fleet.lost(0) is True and fleet.lost(0) is False
    assert fleet.order() == [1] and fleet[0].why == "when its connection dropped"


def test_requests_moved_away_from_a_dead_broker_are_cancelled_there_once_when_it_returns() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    fleet[0].outstanding = 3
    fleet.lost(0)
    fleet.moved(b"r1", 0, 1, 2)
    fleet.moved(b"r2", 0, 1, 1)
    assert (fleet[0].outstanding, fleet[1].outstanding) == (0, 3)
    fleet.heard(0)
    assert fleet.take_moved_away(0) == [b"r1", b"r2"]
    assert fleet.take_moved_away(0) == []


def test_one_broker_is_never_given_up() -> None:
    clock = FakeClock()
    fleet = brokers(clock, count=1)
    clock.now += 60
    assert not fleet.watch and fleet.silent() == [] and fleet.lost(0) is False
    assert fleet.order() == [0] and fleet.next_wakeup() is None and not fleet.heartbeat_due()


def test_silence_is_counted_from_when_reading_starts() -> None:
    clock = FakeClock()
    fleet = brokers(clock)
    clock.now += 60  # a client idle since it was made
    fleet.restart()
    assert fleet.silent() == []
