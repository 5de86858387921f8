"""On an accelerator, whether a batch runs packed (unpadded attention) or padded to its buckets: the start's
timings of both, and the choice per batch.

Theory of operation
-------------------
On an accelerator a padded batch is usually the cheaper one: it runs as a
captured CUDA graph (:mod:`worker.runners.graphs`), one launch, and padding
costs little while the pass's fixed cost dominates.  A packed pass
(:mod:`worker.runners.packing`, ``--unpadded-attention auto``) runs no
padding but launches its kernels one by one, so it wins only where padding
is a large share of a big batch: long, mixed-length inputs on a model large
enough for the GPU to be the bound.  Which side wins is measured, never
assumed:

1. Warm-up, after the graphs are captured, times every bucket twice each
   way, as serving runs it (``run_planned``: the copy to the device, the
   pass, the pooling head and the copy back; tokenizing and padding happen
   on the preparation pool in serving, so they are left out of both):
   padded to the bucket, and packed with the bucket's tokens.  The fastest
   of each is kept (:class:`PassTimings`).  Timing the packed passes at
   every bucket's size also takes the device memory the largest packed
   pass needs before the worker says READY, not while it serves.
2. The packed pass's cost is a straight line through its timings, a fixed
   part and a part per token (:func:`fit_packed`, least squares).  A line
   that does not rise with the tokens is noise, not a measurement: then no
   batch packs.
3. A batch packs where its packed passes (cut by the token budget as
   serving would cut them) are modelled to take less than the timed padded
   passes it would otherwise run (:func:`packing_pays`); a padded pass of a
   shape not timed counts as a loss for packing, so a guess never packs.

Attention's cost, quadratic in each input's length, is outside the line:
the timed packed passes hold inputs of one length each.  Packed passes meet
token counts the graphs never saw, whose first run may cost more; the
``unpadded`` step of ``scripts.benchmarks.cases.gpu_session`` measures the
choice against padded batches alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.runners.grouping import within_budget
from worker.runners.packing import packed_groups
from worker.runners.shapes import Buckets

TIMING_RUNS = 2  # timed runs of each bucket each way; the fastest is kept


@dataclass(frozen=True, slots=True)
class PassTimings:
    """Each bucket's padded pass in seconds, and the packed pass's fitted cost."""

    padded: Mapping[tuple[int, int], float]
    packed_fixed_s: float
    packed_per_token_s: float

    def packed_seconds(self, tokens: int) -> float:
        return self.packed_fixed_s + self.packed_per_token_s * tokens


def fit_packed(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """The least-squares ``(fixed, per_token)`` seconds through ``(tokens, seconds)`` timings of packed passes;
    None where the time does not rise with the tokens (fewer than two sizes, or noise)."""
    if len({tokens for tokens, _ in points}) < 2:
        return None
    count = len(points)
    mean_tokens = sum(tokens for tokens, _ in points) / count
    mean_seconds = sum(seconds for _, seconds in points) / count
    spread = sum((tokens - mean_tokens) ** 2 for tokens, _ in points)
    slope = sum((tokens - mean_tokens) * (seconds - mean_seconds) for tokens, seconds in points) / spread
    if slope <= 0:
        return None
    return max(0.0, mean_seconds - slope * mean_tokens), slope


def timed_passes(shapes: Iterable[tuple[int, int]], plan: Callable[[int, int, bool], Any],
                 timed: Callable[[Any], float]) -> PassTimings | None:
    """Rule 1 and 2: each ``(rows, length)`` bucket's batch, ``plan(rows, length, packed)``, timed padded and
    packed by ``timed`` (the fastest of :data:`TIMING_RUNS` each, the batch built before the clock starts);
    None where the packed line does not rise with the tokens."""
    padded: dict[tuple[int, int], float] = {}
    points: list[tuple[int, float]] = []
    for rows, length in shapes:
        padded_plan, packed_plan = plan(rows, length, False), plan(rows, length, True)
        padded[rows, length] = min(timed(padded_plan) for _ in range(TIMING_RUNS))
        points.append((rows * length, min(timed(packed_plan) for _ in range(TIMING_RUNS))))
    fitted = fit_packed(points)
    return PassTimings(padded, *fitted) if fitted else None


def packing_pays(lengths: Sequence[int], buckets: Buckets, timings: PassTimings | None, budget: int,
                 cap: int | None) -> bool:
    """Whether inputs of ``lengths`` run faster packed (in passes of at most ``cap`` tokens) than padded to their
    buckets (in passes within ``budget``, 0: none), by warm-up's timings; without timings, never."""
    if timings is None or not lengths:
        return False
    everyone = list(range(len(lengths)))
    padded = 0.0
    for batch in within_budget([everyone], lengths, budget, buckets.padded_tokens):
        seconds = timings.padded.get((buckets.rows(len(batch)), buckets.length(max(lengths[i] for i in batch))))
        if seconds is None:
            return False
        padded += seconds
    packed = sum(timings.packed_seconds(sum(lengths[i] for i in group))
                 for group in packed_groups(everyone, lengths, cap))
    return packed < padded
