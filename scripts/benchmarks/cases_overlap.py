"""The overlap case: the next batch tokenized in the model's shadow, on the simulated accelerator.

The delay benchmark's worker (:mod:`scripts.benchmarks.delay`) serves the bench's texts through the
bundled model's real tokenizer, in front of a model that sleeps :data:`BATCH_MS` a batch (a GPU's
time, no CPU): once as the worker runs text models, the encoder thread tokenizing and planning the
next batch while the model runs (``ahead``), once with the inference thread tokenizing each batch
before it runs it (``inline``).  The model takes no CPU, so what differs is whether it waits for
the tokenizer.  The two alternate for ``settings.rounds`` rounds; each row is the middle round.
"""

from __future__ import annotations

import statistics
from typing import Any

from scripts.benchmarks import delay, procs
from scripts.benchmarks.common import Context, row
from worker.config import WorkerConfig

CASE = "overlap"
BATCH_MS = 2.0
CLIENTS = 32
MODES = {"ahead": "tokenized in the model's shadow", "inline": "tokenized before each batch"}


def system_name(mode: str) -> str:
    return f"simulated {BATCH_MS:g} ms batch, {MODES[mode]}"


async def overlap(ctx: Context) -> None:
    """Closed-loop clients against the simulated model, its texts tokenized ahead and inline, in rounds."""
    s = ctx.settings
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    procs.log(f"overlap: {CLIENTS} clients, a model sleeping {BATCH_MS:g} ms a batch behind the real tokenizer")
    for _ in range(s.rounds):
        for mode, results in runs.items():
            results.append(await delay.measure(WorkerConfig.max_batch_delay_ms, CLIENTS, s.duration_s, BATCH_MS,
                                               delay.ITEM_MS, mode))
    ratios = [a["req_s"] / b["req_s"] for a, b in zip(runs["ahead"], runs["inline"], strict=True) if b["req_s"]]
    for mode, results in runs.items():
        paired = {"vs_inline": statistics.median(ratios)} if mode == "ahead" and ratios else {}
        middle = sorted(results, key=lambda result: result["req_s"])[len(results) // 2]
        ctx.rows.append(row(CASE, system_name(mode), CLIENTS, middle, mode=mode, paired=paired, rounds=len(results)))
