"""The padding-aware grouping plan: pure arithmetic, no model."""

from __future__ import annotations

import itertools

import pytest

from worker.runners.grouping import (
    CALIBRATION_LONG,
    CALIBRATION_ROUNDS,
    CALIBRATION_RUNS,
    CALIBRATION_SHORT,
    NEVER_SPLIT,
    CostModel,
    calibrate,
    plan_groups,
    within_budget,
)


def total_cost(lengths: list[int], groups: list[list[int]], model: CostModel) -> float:
    return sum(model.cost(len(g), max(lengths[i] for i in g)) for g in groups)


def test_every_input_is_planned_exactly_once() -> None:
    lengths = [30, 8, 60, 9, 31, 59, 10, 61]
    groups = plan_groups(lengths, CostModel(20.0))
    assert sorted(itertools.chain.from_iterable(groups)) == list(range(len(lengths)))


def test_mixed_lengths_are_split_short_first_when_padding_costs_more_than_a_pass() -> None:
    lengths = [60, 8, 61, 9, 62, 10]
    groups = plan_groups(lengths, CostModel(20.0))
    assert [sorted(lengths[i] for i in g) for g in groups] == [[8, 9, 10], [60, 61, 62]]


def test_a_large_fixed_cost_keeps_one_group() -> None:
    lengths = [60, 8, 61, 9, 62, 10]
    assert len(plan_groups(lengths, CostModel(1_000.0))) == 1
    assert len(plan_groups(lengths, NEVER_SPLIT)) == 1


@pytest.mark.parametrize("overhead", [0.0, 5.0, 40.0, 200.0])
def test_the_plan_is_the_cheapest_contiguous_split(overhead: float) -> None:
    """Brute force over every split of the sorted lengths agrees with the dynamic programme."""
    lengths = [17, 3, 44, 8, 8, 29, 51, 12]
    model = CostModel(overhead)
    planned = total_cost(lengths, plan_groups(lengths, model), model)
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    cheapest = min(
        total_cost(lengths, [order[a:b] for a, b in itertools.pairwise((0, *cuts, len(order)))], model)
        for k in range(len(order))
        for cuts in itertools.combinations(range(1, len(order)), k)
    )
    assert planned == pytest.approx(cheapest)


def test_empty_and_single_batches() -> None:
    assert plan_groups([], CostModel(1.0)) == []
    assert plan_groups([7], CostModel(1.0)) == [[0]]


def test_calibration_recovers_the_fixed_cost_of_a_linear_device() -> None:
    per_token, overhead = 0.0002, 0.015  # seconds: like the CPU here
    model = calibrate(lambda rows, tokens: overhead + per_token * rows * tokens)
    assert model.overhead_tokens == pytest.approx(overhead / per_token)
    # ...and predicts the time of a plan: two passes, each paying the fixed cost.
    lengths = [10, 12, 40]
    assert model.seconds([[0, 1], [2]], lengths) == pytest.approx(2 * overhead + per_token * (2 * 12 + 40))


def test_no_time_is_modelled_without_a_calibration() -> None:
    assert CostModel(20.0).seconds([[0]], [5]) == 0.0
    assert NEVER_SPLIT.seconds([[0]], [5]) == 0.0


def test_calibration_never_splits_when_tokens_cost_nothing() -> None:
    assert calibrate(lambda rows, tokens: 0.005) == NEVER_SPLIT


def test_a_long_shape_timed_faster_than_the_short_one_is_timed_again_not_taken_for_a_verdict() -> None:
    """A busy host's stolen time: every short run of the first round was slowed, the long ones were not."""
    per_token, overhead = 0.0002, 0.015
    calls: list[tuple[int, int]] = []

    def seconds_for(rows: int, tokens: int) -> float:
        calls.append((rows, tokens))
        seconds = overhead + per_token * rows * tokens
        first_round = len(calls) <= 2 * CALIBRATION_RUNS
        return seconds + 1.0 if (rows, tokens) == CALIBRATION_SHORT and first_round else seconds

    model = calibrate(seconds_for)
    assert model.overhead_tokens == pytest.approx(overhead / per_token)
    assert len(calls) == 4 * CALIBRATION_RUNS, "a second round, and no more"
    assert calls[:2] == [CALIBRATION_SHORT, CALIBRATION_LONG], "the shapes in turn"


def test_a_host_that_never_times_the_long_shape_slower_gets_a_model_that_never_splits() -> None:
    calls: list[int] = []

    def seconds_for(rows: int, tokens: int) -> float:
        calls.append(rows)
        return 0.002 if (rows, tokens) == CALIBRATION_LONG else 0.004

    assert calibrate(seconds_for) == NEVER_SPLIT
    assert len(calls) == 2 * CALIBRATION_RUNS * CALIBRATION_ROUNDS


def test_a_packed_pass_is_modelled_as_one_fixed_cost_and_its_real_tokens() -> None:
    model = CostModel(20.0, 0.001)
    assert model.packed_seconds([10, 12, 40]) == pytest.approx(0.001 * (20 + 62))
    assert model.packed_seconds([10, 12, 40]) < model.seconds([[0, 1, 2]], [10, 12, 40]), "no padding is paid"
    assert CostModel(20.0).packed_seconds([5]) == NEVER_SPLIT.packed_seconds([5]) == 0.0


@pytest.mark.parametrize(("groups", "lengths", "budget", "passes"), [
    ([[0, 1, 2, 3]], [10, 10, 10, 10], 0, [[0, 1, 2, 3]]),  # no budget: as planned
    ([[0, 1, 2, 3]], [10, 10, 10, 10], 40, [[0, 1, 2, 3]]),
    ([[0, 1, 2, 3]], [10, 10, 10, 10], 39, [[0, 1, 2], [3]]),
    ([[0, 1, 2, 3]], [30, 5, 20, 5], 40, [[1, 3], [2], [0]]),  # shortest first: two of 5, then 20 alone
    ([[0], [1, 2]], [100, 8, 8], 50, [[0], [1, 2]]),  # one input over the budget runs alone
    ([], [], 10, []),
])
def test_a_token_budget_cuts_each_group_into_passes_within_it(groups: list[list[int]], lengths: list[int],
                                                              budget: int, passes: list[list[int]]) -> None:
    cut = within_budget(groups, lengths, budget, lambda rows, longest: rows * longest)
    assert cut == passes
    assert sorted(i for each in cut for i in each) == sorted(i for each in groups for i in each)
