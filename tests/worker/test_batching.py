"""The batching policy with a fake clock: one deadline per batch, a size cap, no needless wait."""

from __future__ import annotations

from worker.batching import COST_MIN_BATCHES, RETURN_HISTORY, RETURN_SHARE, ArrivalRate, BatchCost, BatchPolicy


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


# --- rule 7: answered clients come back ------------------------------------------------------------

BATCH_S = 0.100  # the batch that just ended took this long; its clients come back a few ms later


def end_batch(p: BatchPolicy, at: float, answered: int, seconds: float = BATCH_S) -> None:
    p.ran(answered, seconds, answered=answered, now=at)


def returning(p: BatchPolicy, freed: float, lags_ms: list[float], pending_before: int = 0) -> list[float]:
    """Clients come back ``lags_ms`` after the model freed at ``freed``; each one's verdict from run_at."""
    verdicts = []
    first = None
    for count, lag in enumerate(lags_ms, start=1):
        now = freed + lag / 1000
        first = first if first is not None else now
        p.arrived(now, 1, others_held=pending_before + count > 1)
        at = p.run_at(now, pending_before + count, min(first, freed) if pending_before else first, freed)
        assert at is not None
        verdicts.append(at)
    return verdicts


def test_a_closed_loop_batch_waits_for_every_answered_client_and_runs_when_the_last_is_back() -> None:
    """Eight clients through a gateway come back 5 to 11 ms after their answers: one batch of 8, never 1 + 7."""
    p = policy(max_batch=32)
    freed = 1.0
    end_batch(p, freed, answered=8)
    lags = [5.0, 7.5, 8.0, 8.5, 9.0, 9.5, 10.0, 11.0]
    verdicts = returning(p, freed, lags)
    deadline = freed + RETURN_SHARE * BATCH_S
    assert verdicts[:-1] == [deadline] * 7  # one deadline, set when the batch ended
    assert verdicts[-1] == freed + lags[-1] / 1000  # the eighth is back: run at once


def test_a_lone_client_is_its_own_return_and_never_waits() -> None:
    p = policy(max_batch=32)
    t = 0.0
    for _ in range(50):
        t += 0.003  # back 3 ms after its answer
        p.arrived(t, 1, others_held=False)
        assert p.run_at(t, 1, t, t - 0.003) == t
        end_batch(p, t + 0.010, answered=1, seconds=0.010)
        t += 0.010


def test_clients_that_do_not_come_back_cost_at_most_a_share_of_the_batch() -> None:
    """Eight answered, three came back (the others went to another worker): run at the return deadline."""
    p = policy(max_batch=32)
    end_batch(p, 1.0, answered=8)
    verdicts = returning(p, 1.0, [2.0, 3.0, 4.0])
    assert verdicts == [1.0 + RETURN_SHARE * BATCH_S] * 3
    now = 1.0 + RETURN_SHARE * BATCH_S
    assert p.run_at(now, 3, 1.002, 1.0) == now


def test_the_return_deadline_is_the_slowest_recent_return_when_that_is_sooner() -> None:
    p = policy(max_batch=32)
    t = 1.0
    for _ in range(RETURN_HISTORY):
        end_batch(p, t, answered=4)
        returning(p, t, [1.0, 2.0, 3.0, 4.0])  # all four back within 4 ms
        t += 0.2
    end_batch(p, t, answered=4)
    assert returning(p, t, [1.0, 2.0]) == [t + 0.004] * 2


def test_returns_that_came_late_lengthen_the_return_time_up_to_the_cap() -> None:
    """A straggler that arrived during the next batch still counts: the next deadline waits for it."""
    p = policy(max_batch=32)
    for _ in range(RETURN_HISTORY):
        end_batch(p, 1.0, answered=2)
        returning(p, 1.0, [1.0, 2.0])
    end_batch(p, 2.0, answered=2)
    returning(p, 2.0, [1.0])
    p.arrived(2.015, 1, others_held=True)  # back 15 ms after the model freed: it missed its batch
    end_batch(p, 3.0, answered=2)
    assert returning(p, 3.0, [1.0]) == [3.015]
    end_batch(p, 4.0, answered=2)
    returning(p, 4.0, [1.0])
    p.arrived(4.5, 1, others_held=True)  # half a second: far beyond the cap
    end_batch(p, 5.0, answered=2)
    assert returning(p, 5.0, [1.0]) == [5.0 + RETURN_SHARE * BATCH_S]


def test_items_that_queued_behind_the_batch_wait_with_the_returns() -> None:
    p = policy(max_batch=32)
    p.arrived(0.95, 1, others_held=True)
    p.arrived(0.96, 1, others_held=True)
    end_batch(p, 1.0, answered=4)
    deadline = 1.0 + RETURN_SHARE * BATCH_S
    assert p.run_at(1.0, 2, 0.95, 1.0) == deadline
    assert returning(p, 1.0, [3.0, 4.0, 5.0, 6.0], pending_before=2) == [deadline] * 3 + [1.006]


def test_the_returns_are_cut_at_the_largest_batch() -> None:
    p = policy(max_batch=4)
    end_batch(p, 1.0, answered=8)
    assert returning(p, 1.0, [1.0, 2.0, 3.0, 4.0])[-1] == 1.004


def test_long_after_the_return_deadline_a_new_arrival_follows_the_rate() -> None:
    p = policy(max_batch=32)
    steady_stream(p, start=0.0, per_second=1000, seconds=1)  # a rate that says wait (rules 4 and 5)
    end_batch(p, 1.0, answered=8)
    later = 1.0 + 2 * RETURN_SHARE * BATCH_S
    p.arrived(later, 1, others_held=False)
    assert p.run_at(later, 1, later, 1.0) == later + 0.005


def test_zero_delay_never_waits_for_returns_either() -> None:
    p = policy(max_batch=32, delay_ms=0)
    end_batch(p, 1.0, answered=8)
    assert returning(p, 1.0, [1.0]) == [1.001]


def test_a_batch_that_answered_nobody_expects_nobody() -> None:
    """Its items belonged to a request still running in the next batch: rules 3 to 5 decide, as before."""
    p = policy(max_batch=32)
    end_batch(p, 1.0, answered=0)
    assert returning(p, 1.0, [1.0]) == [1.001]
