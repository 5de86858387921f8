"""The batching policy with a fake clock: one deadline per batch, a size cap, no needless wait."""

from __future__ import annotations

from worker.batching import COST_MIN_BATCHES, ArrivalRate, BatchCost, BatchPolicy


def policy(max_batch: int = 4, delay_ms: float = 5.0) -> BatchPolicy:
    return BatchPolicy(max_batch, delay_ms / 1000)


def steady_stream(p: BatchPolicy, start: float, per_second: float, seconds: float) -> float:
    """Record a stream of single items from many clients and return the time of the last one."""
    t, gap = start, 1 / per_second
    while t < start + seconds:
        p.arrived(t, 1, others_held=True)
        t += gap
    return t - gap


def test_nothing_pending_means_nothing_to_run() -> None:
    assert policy().run_at(now=10.0, pending=0, first_arrival=float("inf"), idle_since=0.0) is None


def test_lone_request_on_a_quiet_worker_runs_at_once() -> None:
    p = policy()
    p.arrived(10.0, 1, others_held=False)
    assert p.run_at(now=10.0, pending=1, first_arrival=10.0, idle_since=0.0) == 10.0


def test_a_lone_closed_loop_client_never_waits_however_fast_it_sends() -> None:
    """300 requests/s, one at a time: each finds the worker empty, so none says more are coming.

    Counting them as traffic (1.5 expected in 5 ms) made a lone client wait the whole window every time.
    """
    p = policy(max_batch=32)
    t = 0.0
    while t < 1.0:
        p.arrived(t, 1, others_held=False)
        assert p.run_at(now=t, pending=1, first_arrival=t, idle_since=t - 0.001) == t
        t += 1 / 300


def test_slow_trickle_does_not_wait() -> None:
    p = policy()
    last = steady_stream(p, start=0.0, per_second=40, seconds=2)
    assert p.run_at(now=last, pending=1, first_arrival=last, idle_since=0.0) == last


def test_busy_stream_waits_for_the_window_that_the_first_item_started() -> None:
    p = policy(max_batch=32)
    last = steady_stream(p, start=0.0, per_second=1000, seconds=1)
    first = last
    assert p.run_at(now=first, pending=1, first_arrival=first, idle_since=0.0) == first + 0.005
    # Later arrivals never push the deadline back.
    for step in range(1, 5):
        now = first + step * 0.001
        p.arrived(now, 1, others_held=True)
        assert p.run_at(now=now, pending=step + 1, first_arrival=first, idle_since=0.0) == first + 0.005


def test_deadline_passed_runs_now() -> None:
    p = policy(max_batch=32)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.006, pending=3, first_arrival=1.0, idle_since=0.0) == 1.006


def test_size_cap_runs_at_once_even_inside_the_window() -> None:
    p = policy(max_batch=4)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.0, pending=4, first_arrival=1.0, idle_since=0.0) == 1.0


def test_items_that_waited_for_a_busy_model_run_when_it_frees_if_no_more_are_coming() -> None:
    p = policy(max_batch=32)
    p.arrived(0.5, 2, others_held=True)
    assert p.run_at(now=1.0, pending=2, first_arrival=0.5, idle_since=1.0) == 1.0


def test_the_batch_after_a_busy_model_gets_one_window_from_when_the_model_freed() -> None:
    """Closed-loop clients: the last batch's clients are sending again, and one early item is already waiting.

    Running that item alone at once would let it and the returning rest alternate as two batches for good.
    """
    p = policy(max_batch=32)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    freed = 1.0
    assert p.run_at(now=freed, pending=1, first_arrival=0.95, idle_since=freed) == freed + 0.005
    for step in range(1, 5):  # the returning clients never push the deadline back
        now = freed + step * 0.001
        p.arrived(now, 1, others_held=True)
        assert p.run_at(now=now, pending=1 + step, first_arrival=0.95, idle_since=freed) == freed + 0.005
    assert p.run_at(now=freed + 0.005, pending=5, first_arrival=0.95, idle_since=freed) == freed + 0.005


def test_a_full_batch_after_a_busy_model_runs_at_once() -> None:
    p = policy(max_batch=4)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.0, pending=4, first_arrival=0.95, idle_since=1.0) == 1.0


def test_zero_delay_never_waits() -> None:
    p = policy(delay_ms=0)
    steady_stream(p, start=0.0, per_second=5000, seconds=1)
    assert p.run_at(now=1.0, pending=1, first_arrival=1.0, idle_since=0.0) == 1.0


def test_arrival_rate_forgets_old_arrivals() -> None:
    rate = ArrivalRate(horizon_s=1.0)
    for i in range(10):
        rate.record(i * 0.01, 2)
    assert rate.per_second(0.1) == 20
    assert rate.per_second(5.0) == 0


def run_batches(p: BatchPolicy, fixed_ms: float, item_ms: float, sizes: list[int]) -> None:
    for items in sizes:
        p.ran(items, (fixed_ms + item_ms * items) / 1000)


def test_the_cost_fit_finds_the_fixed_cost_per_batch() -> None:
    cost = BatchCost()
    for items in [1, 4, 8, 32, 2, 16] * 3:
        cost.record(items, 0.020 + 0.0002 * items)
    assert cost.fixed_s is not None and abs(cost.fixed_s - 0.020) < 1e-9


def test_the_cost_fit_is_unknown_until_batches_of_two_sizes_ran() -> None:
    cost = BatchCost()
    for _ in range(COST_MIN_BATCHES):
        cost.record(1, 0.010)
    assert cost.fixed_s is None  # one size only: fixed and per-item cost cannot be told apart
    cost.record(8, 0.017)
    assert cost.fixed_s is not None and abs(cost.fixed_s - 0.009) < 1e-9


def test_a_steady_run_of_one_size_keeps_what_other_sizes_cost() -> None:
    """Eight closed-loop clients run batches of 8 over and over; a batch of 1 seen long ago still counts."""
    cost = BatchCost()
    for items in [1, 8] * 4:
        cost.record(items, 0.002 + 0.0002 * items)
    for _ in range(1_000):
        cost.record(8, 0.002 + 0.0002 * 8)
    assert cost.fixed_s is not None and abs(cost.fixed_s - 0.002) < 1e-9


def test_a_batch_whose_size_costs_nothing_is_all_fixed_cost() -> None:
    """Noise can make larger batches look cheaper; then the size buys nothing and the batch time is fixed."""
    cost = BatchCost()
    for items, ms in [(1, 21), (32, 19)] * 5:
        cost.record(items, ms / 1000)
    assert cost.fixed_s is not None and abs(cost.fixed_s - 0.020) < 1e-9


def test_the_cost_fit_follows_the_model_when_it_changes() -> None:
    cost = BatchCost()
    for items in [1, 8] * 8:
        cost.record(items, 0.010 + 0.001 * items)
    for items in [1, 8] * 100:  # e.g. the worker dropped to one torch thread
        cost.record(items, 0.002 + 0.001 * items)
    assert cost.fixed_s is not None and abs(cost.fixed_s - 0.002) < 1e-6


def test_a_fast_model_waits_no_longer_than_its_fixed_cost() -> None:
    """A 2 ms batch on a 5 ms delay: idling 5 ms to save one 2 ms batch loses 3 ms of model time."""
    p = policy(max_batch=32, delay_ms=5)
    run_batches(p, fixed_ms=2, item_ms=0.2, sizes=[1, 4, 8, 2] * 4)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.0, pending=1, first_arrival=1.0, idle_since=0.5) == 1.0 + 0.002


def test_a_slow_model_still_waits_the_whole_delay() -> None:
    p = policy(max_batch=32, delay_ms=5)
    run_batches(p, fixed_ms=20, item_ms=0.2, sizes=[1, 4, 8, 2] * 4)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.0, pending=1, first_arrival=1.0, idle_since=0.5) == 1.0 + 0.005


def test_a_model_with_no_fixed_cost_never_waits() -> None:
    """Each item costs the same in any batch (as on a CPU without padding): merging saves nothing."""
    p = policy(max_batch=32, delay_ms=5)
    run_batches(p, fixed_ms=0, item_ms=8, sizes=[1, 4, 8, 2] * 4)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)
    assert p.run_at(now=1.0, pending=1, first_arrival=1.0, idle_since=0.5) == 1.0
