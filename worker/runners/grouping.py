"""Padding-aware grouping: split one batch into length-sorted groups when that is cheaper to run.

Theory of operation
-------------------
A transformer runs a batch padded to its longest input, so a batch that mixes
8-token and 60-token texts pays for 60 tokens on every row.  On a CPU the cost
of one forward pass is close to ``overhead + per_token * rows * longest``; on
a GPU the overhead dominates and padding is nearly free.  Dividing by
``per_token`` gives the cost in padded tokens::

    cost(group) = overhead_tokens + rows * longest

Sorting the inputs by length and cutting the sorted list into contiguous
groups is optimal for that cost (a group's price depends only on its size and
its longest member), so a small dynamic programme over the sorted lengths
finds the cheapest split exactly.  ``overhead_tokens`` is measured on the
real model at warm-up (:func:`calibrate`): where splitting does not pay, as on
a GPU, the plan is one group and nothing changes.

A token budget (``--max-batch-tokens``, TEI's setting of that name) bounds
what one pass holds, padding included, whatever the cost model says: a group
over it is cut into passes within it (:func:`within_budget`), so a batch of
long inputs cannot take more memory than the operator allowed.  An input
longer than the budget runs alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

CALIBRATION_SHORT = (1, 16)  # (rows, tokens) of the shape that shows the fixed cost
CALIBRATION_LONG = (16, 64)  # and of one that shows the cost per token
CALIBRATION_RUNS = 3
CALIBRATION_ROUNDS = 3  # rounds of runs at most, while the longer shape times faster than the shorter


@dataclass(frozen=True, slots=True)
class CostModel:
    """Cost of one forward pass, in padded tokens; ``overhead_tokens`` is the fixed part.

    ``seconds_per_token`` (0 when unknown) turns a cost into the time the pass
    took at calibration, which :mod:`worker.threads` compares live batches with.
    """

    overhead_tokens: float
    seconds_per_token: float = 0.0

    def cost(self, rows: int, longest: int) -> float:
        return self.overhead_tokens + rows * longest

    def seconds(self, groups: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
        """Modelled time of running ``groups`` (indices into ``lengths``) one pass each; 0 if unknown."""
        if not self.seconds_per_token or self.overhead_tokens == float("inf"):
            return 0.0
        return self.seconds_per_token * sum(self.cost(len(group), max(lengths[i] for i in group))
                                            for group in groups if group)

    def packed_seconds(self, lengths: Sequence[int]) -> float:
        """Modelled time of one packed pass over inputs of ``lengths`` (:mod:`worker.runners.packing`):
        no padding, one fixed cost; 0 if unknown."""
        if not self.seconds_per_token or self.overhead_tokens == float("inf"):
            return 0.0
        return self.seconds_per_token * (self.overhead_tokens + sum(lengths))


NEVER_SPLIT = CostModel(float("inf"))


def plan_groups(lengths: Sequence[int], model: CostModel) -> list[list[int]]:
    """Indices of ``lengths`` in groups of similar length, shortest first, at the least modelled cost."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    if len(order) < 2 or model.overhead_tokens == float("inf"):
        return [order] if order else []
    sorted_lengths = [lengths[i] for i in order]
    # best[j]: cheapest cost of the first j sorted inputs; cut[j]: where its last group starts.
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = sorted_lengths[end - 1]
        for start in range(end):
            total = best[start] + model.cost(end - start, longest)
            if total < best[end]:
                best[end], cut[end] = total, start
    groups: list[list[int]] = []
    end = len(order)
    while end > 0:
        groups.append(order[cut[end]:end])
        end = cut[end]
    return groups[::-1]


def calibrate(seconds_for: Callable[[int, int], float]) -> CostModel:
    """Fit the fixed cost from two timed shapes; ``seconds_for(rows, tokens)`` runs one padded batch.

    The two shapes are timed in turn, a few times each, and each one's fastest run kept, so one scheduling
    hiccup does not skew the fit and a stretch of contention slows both alike.  The longer shape has 64 times
    the tokens of the shorter: timed faster than it, the host took the short runs' time away, and the
    rounds are timed again (at most :data:`CALIBRATION_ROUNDS` times) rather than taking noise for a verdict.
    If the longer shape is not measurably slower per token (a GPU), the model never splits.
    """
    (short_rows, short_tokens), (long_rows, long_tokens) = CALIBRATION_SHORT, CALIBRATION_LONG
    short = long = float("inf")
    for _ in range(CALIBRATION_ROUNDS):
        for _ in range(CALIBRATION_RUNS):
            short = min(short, seconds_for(short_rows, short_tokens))
            long = min(long, seconds_for(long_rows, long_tokens))
        if long >= short:
            break
    extra_tokens = long_rows * long_tokens - short_rows * short_tokens
    per_token = (long - short) / extra_tokens
    if per_token <= 0:
        return NEVER_SPLIT
    return CostModel(max(0.0, short / per_token - short_rows * short_tokens), per_token)


def within_budget(groups: list[list[int]], lengths: Sequence[int], budget: int,
                  padded_tokens: Callable[[int, int], int]) -> list[list[int]]:
    """``groups`` (indices into ``lengths``), each cut into passes of at most ``budget`` tokens, padding included:
    ``padded_tokens(rows, longest)`` is what a pass of ``rows`` inputs, the longest of ``longest`` tokens, runs.
    Each group's inputs are taken shortest first; one input over the budget runs alone.  0: no budget."""
    if not budget:
        return groups
    passes: list[list[int]] = []
    for group in groups:
        current: list[int] = []
        for index in sorted(group, key=lengths.__getitem__):
            if current and padded_tokens(len(current) + 1, lengths[index]) > budget:
                passes.append(current)
                current = []
            current.append(index)
        if current:
            passes.append(current)
    return passes
