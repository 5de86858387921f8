"""The few padded shapes a model runs on an accelerator, so that no shape pays twice, and none while serving.

Theory of operation
-------------------
On CUDA, the first batch of a new shape pays once for what the shape needs:
kernel selection, cuBLAS workspaces, the caching allocator's first blocks.
That costs several times the batch itself (BENCHMARKS.md, GPU: new shapes),
and serving text of every length meets a new shape nearly every batch at
first.  So on CUDA a
batch is padded up to a *bucket*: its longest input's length rounded up to
one of :data:`LENGTHS` (and to the model's maximum), and its row count to
one of :data:`ROWS` (and to the largest batch).  Every bucket runs once
during warm-up, before the worker says READY, so serving never meets a new
shape.  Padding costs little on a GPU, where a pass's time is mostly fixed
(:mod:`worker.runners.grouping` calibrates that and keeps one group), and
each bucket adds at most a third to a batch's tokens beyond 64 tokens and
at most a factor of two to its rows.

With a token budget (``--max-batch-tokens``) no pass holds more than that
many tokens, padding included, so the buckets over it never run and are
neither warmed nor captured; a pass of one input always runs, however long.

The extra rows are filler: one token each (the tokenizer's first special
token) with its attention mask set, so that no row attends to nothing, and
their outputs are thrown away.  On the CPU, shapes cost nothing up front,
and batches stay exactly as long as they are (or packed).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _rounded_up(value: int, steps: tuple[int, ...], largest: int) -> int:
    """The first of ``steps`` at least ``value``, never above ``largest`` (itself a step)."""
    if value >= largest:
        return largest
    return min(steps[bisect.bisect_left(steps, value)] if value <= steps[-1] else largest, largest)


@dataclass(frozen=True, slots=True)
class Buckets:
    """The shapes of a model that reads at most ``max_length`` tokens in batches of at most ``max_rows``."""

    max_length: int
    max_rows: int
    max_tokens: int = 0  # the most tokens of a pass of several inputs, padding included; 0: no budget

    def __post_init__(self) -> None:
        if self.max_length < 1 or self.max_rows < 1 or self.max_tokens < 0:
            raise ValueError(f"buckets need a positive length and row count and a budget >= 0, not "
                             f"{self.max_length}, {self.max_rows}, {self.max_tokens}")

    def padded_tokens(self, rows: int, longest: int) -> int:
        """The tokens a pass of ``rows`` inputs, the longest of ``longest`` tokens, runs in its bucket."""
        return self.rows(rows) * self.length(longest)

    def length(self, longest: int) -> int:
        """The padded length of a batch whose longest input has ``longest`` tokens."""
        return _rounded_up(max(1, longest), LENGTHS, self.max_length)

    def rows(self, count: int) -> int:
        """The padded row count of a batch of ``count`` inputs (a batch may exceed the largest: it is as is)."""
        return count if count > self.max_rows else _rounded_up(max(1, count), ROWS, self.max_rows)

    @property
    def lengths(self) -> list[int]:
        return sorted({self.length(length) for length in (*LENGTHS, self.max_length) if length <= self.max_length}
                      | {self.length(1)})

    @property
    def row_counts(self) -> list[int]:
        return sorted({self.rows(count) for count in (*ROWS, self.max_rows) if count <= self.max_rows} | {1})

    def shapes(self) -> list[tuple[int, int]]:
        """Every ``(rows, length)`` a batch can be padded to, within the budget, largest first (the order warm-up
        runs them)."""
        return sorted(((rows, length) for rows in self.row_counts for length in self.lengths
                       if rows == 1 or not self.max_tokens or rows * length <= self.max_tokens),
                      key=lambda shape: (shape[0] * shape[1], shape), reverse=True)
