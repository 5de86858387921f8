"""The phases of a start: each counts its own time, nested ones taken out of the outer, and none outside a recording."""

from __future__ import annotations

from worker.runners import phases
from worker.runners.phases import StartPhases, phase, process_age_s, recording


class Ticks:
    """A clock that moves only when told: what is tested is the arithmetic, not a duration."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_nested_phase_is_taken_out_of_the_outer_one_and_the_rest_is_other() -> None:
    clock = Ticks()
    with recording(StartPhases(clock)) as times:
        with phase("warm-up"):
            clock.now += 1.0
            with phase("calibration"):
                clock.now += 2.0
            phases.note("calibration", "from the cache")
        with phase("warm-up"):
            clock.now += 0.5
    assert times.seconds == {"warm-up": 1.5, "calibration": 2.0}
    assert times.summary(elapsed=4.0) == "warm-up 1.50 s, calibration 2.00 s (from the cache), other 0.50 s"


def test_phases_outside_a_recording_record_nothing() -> None:
    with phase("model"):
        phases.note("model", "not recorded")
    with recording() as times:
        phases.note("verdict", "from the cache")
    assert times.seconds == {} and times.summary() == "verdict: from the cache"


def test_this_process_knows_its_age() -> None:
    age = process_age_s()
    assert age is None or age > 0
