"""The thread governor, driven with made-up batch times and a fake clock."""

from __future__ import annotations

import itertools

import pytest

from worker.threads import (
    BASE_PROBE_INTERVAL_S,
    MAX_PROBE_INTERVAL_S,
    PROBE_BATCHES,
    RECENT_BATCHES,
    SUSPECT_SLOWDOWN,
    TRUSTED_FLOOR,
    ThreadGovernor,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_batch(governor: ThreadGovernor, clock: FakeClock, seconds_at: dict[int, float],
              modelled: float = 0.25, model: str = "m") -> int:
    """Run one batch at the governor's choice; ``seconds_at`` maps a thread count to its batch time."""
    threads = governor.threads
    seconds = seconds_at[threads]
    clock.now += seconds
    governor.observe(threads, seconds, modelled, model)
    return threads


QUIET = {2: 0.25, 1: 0.42}  # measured here: batch of 32, alone on 2 cores
ONE_NEIGHBOUR = {2: 0.55, 1: 0.42}  # next to one busy process
NEIGHBOURS_GONE = QUIET


def test_a_quiet_machine_keeps_every_thread_and_never_probes() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    used = {run_batch(governor, clock, QUIET) for _ in range(200)}
    assert used == {2}


def test_contended_cores_move_to_one_thread_after_a_probe_of_two_batches() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    assert run_batch(governor, clock, ONE_NEIGHBOUR) == 2  # slowdown 2.2: suspicious
    assert run_batch(governor, clock, ONE_NEIGHBOUR) == 1  # the probe's first batch, 1.7: wins
    assert governor.current == 2
    assert run_batch(governor, clock, ONE_NEIGHBOUR) == 1  # and its second: switch
    assert governor.current == 1
    assert governor.lost_slowdown == ONE_NEIGHBOUR[2] / 0.25
    assert {run_batch(governor, clock, ONE_NEIGHBOUR) for _ in range(3)} == {1}


def test_probes_go_back_to_every_thread_once_the_neighbours_leave() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    for _ in range(1 + PROBE_BATCHES):
        run_batch(governor, clock, ONE_NEIGHBOUR)
    assert governor.current == 1
    used = [run_batch(governor, clock, NEIGHBOURS_GONE) for _ in range(10)]
    assert governor.current == 2
    # One thread until the probe interval passed (0.42 s a batch), then the probe won.
    switched_at = used.index(2)
    assert switched_at * NEIGHBOURS_GONE[1] >= BASE_PROBE_INTERVAL_S
    assert set(used[switched_at:]) == {2}


def test_losing_probes_wait_twice_as_long_each_time_up_to_a_cap() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    for _ in range(1 + PROBE_BATCHES):
        run_batch(governor, clock, ONE_NEIGHBOUR)
    probe_times = []
    while clock.now < 300:
        if run_batch(governor, clock, ONE_NEIGHBOUR) == 2:
            probe_times.append(clock.now)
    assert governor.current == 1
    gaps = [later - earlier for earlier, later in itertools.pairwise(probe_times)]
    assert gaps[0] >= 2 * BASE_PROBE_INTERVAL_S
    assert all(later >= earlier for earlier, later in itertools.pairwise(gaps))
    assert max(gaps) <= MAX_PROBE_INTERVAL_S + ONE_NEIGHBOUR[1] + ONE_NEIGHBOUR[2]
    assert max(gaps) >= MAX_PROBE_INTERVAL_S


def test_one_lucky_probe_batch_does_not_switch_back() -> None:
    """Seen in the open-loop overload: 1.8x on one thread, 2.1x on two, and now and then one fast batch on two."""
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    overload = {2: 0.25 * 2.1, 1: 0.25 * 1.8}
    for _ in range(1 + PROBE_BATCHES):
        run_batch(governor, clock, overload)
    assert governor.current == 1
    lucky_then_usual = iter([0.25 * 1.5, 0.25 * 2.1])
    probes = 0
    while probes < 2:
        threads = governor.threads
        seconds = next(lucky_then_usual) if threads == 2 else overload[1]
        probes += threads == 2
        clock.now += seconds
        governor.observe(threads, seconds, 0.25)
    assert governor.current == 1
    assert governor.threads == 1  # the probe ended at its losing batch


def test_a_probe_that_is_not_clearly_faster_does_not_switch() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    barely = {2: 0.25 * SUSPECT_SLOWDOWN, 1: 0.25 * SUSPECT_SLOWDOWN * 0.95}
    run_batch(governor, clock, barely)
    assert run_batch(governor, clock, barely) == 1
    assert governor.current == 2


def test_batches_without_a_modelled_time_and_single_thread_workers_change_nothing() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    for _ in range(10):
        run_batch(governor, clock, {2: 5.0}, modelled=0.0)
    assert governor.threads == 2 and governor.slowdown == 0.0
    single = ThreadGovernor(1, clock)
    for _ in range(10):
        run_batch(single, clock, {1: 5.0})
    assert single.threads == 1


BUSY_CALIBRATION = 0.25 * 7  # a record made on a host 7x busier than this one (seen on a nightly run)


def test_a_calibration_made_on_a_busy_host_gives_way_to_the_quiet_batches_seen_since() -> None:
    """Against the busy record, contended batches (0.31 of it) never look slow; against the quiet batches they do."""
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    used = {run_batch(governor, clock, QUIET, modelled=BUSY_CALIBRATION) for _ in range(RECENT_BATCHES)}
    assert used == {2}
    assert governor.reference("m") == pytest.approx(QUIET[2] / BUSY_CALIBRATION)
    # Two contended batches make the median of the last three slow, then the probe's two batches win.
    used = {run_batch(governor, clock, ONE_NEIGHBOUR, modelled=BUSY_CALIBRATION) for _ in range(2 + PROBE_BATCHES)}
    assert governor.current == 1
    assert governor.lost_slowdown == pytest.approx(ONE_NEIGHBOUR[2] / QUIET[2])
    assert {run_batch(governor, clock, ONE_NEIGHBOUR, modelled=BUSY_CALIBRATION) for _ in range(3)} == {1}


def test_without_a_floor_the_busy_calibration_hides_the_neighbour() -> None:
    """The same contended batches, with no quiet ones seen first: nothing to compare them with but the record."""
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    used = {run_batch(governor, clock, ONE_NEIGHBOUR, modelled=BUSY_CALIBRATION) for _ in range(50)}
    assert used == {2}
    assert governor.slowdown < SUSPECT_SLOWDOWN


def test_batches_a_little_faster_than_calibrated_leave_calibration_the_reference() -> None:
    """Model misfit: quiet batches at 0.75 of their modelled time, ordinary ones at 1.2, never probed."""
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    quick, ordinary = {2: 0.25 * 0.75}, {2: 0.25 * 1.2}
    assert 0.75 > TRUSTED_FLOOR and 1.2 / 0.75 >= SUSPECT_SLOWDOWN
    used = {run_batch(governor, clock, quick) for _ in range(10)}
    used |= {run_batch(governor, clock, ordinary) for _ in range(100)}
    assert used == {2}
    assert governor.reference("m") == 1.0


def test_one_fast_batch_does_not_lower_the_reference() -> None:
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    for seconds in [0.25, 0.25 * 0.2, 0.25, 0.25, 0.25 * 0.2, 0.25]:
        run_batch(governor, clock, {2: seconds})
    assert governor.reference("m") == 1.0 and governor.lowest_reference == 1.0


def test_each_model_has_its_own_reference() -> None:
    """Two models on one worker: one calibrated on a busy host, one not; only the first one's reference moves."""
    clock = FakeClock()
    governor = ThreadGovernor(2, clock)
    for _ in range(RECENT_BATCHES):
        run_batch(governor, clock, QUIET, modelled=BUSY_CALIBRATION, model="busy")
        run_batch(governor, clock, QUIET, model="quiet")
    assert governor.reference("busy") == pytest.approx(QUIET[2] / BUSY_CALIBRATION)
    assert governor.reference("quiet") == 1.0
    assert governor.lowest_reference == governor.reference("busy")
    used = {run_batch(governor, clock, QUIET, model="quiet") for _ in range(20)}
    assert used == {2} and governor.slowdown == pytest.approx(1.0)
