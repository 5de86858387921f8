"""The plain histogram that the broker core and the worker keep for their metrics."""

from __future__ import annotations

from zbatch.runtime.histogram import Histogram


def test_buckets_are_cumulative_and_a_bound_belongs_to_its_own_bucket() -> None:
    histogram = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 2.0, 7.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("1.0", 2), ("2.0", 4), ("+Inf", 5)]
    assert histogram.count == 5 and histogram.total == 12.0
