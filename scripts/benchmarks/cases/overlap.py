"""The overlap case: the next batch tokenized in the model's shadow, on the simulated accelerator and the real model.

The delay benchmark's worker (:mod:`scripts.benchmarks.systems.accelerator`) serves the bench's texts through the
bundled model's real tokenizer, in front of a model that sleeps :data:`BATCH_MS` a batch (a GPU's
time, no CPU): once as the worker runs text models, the preparation pool tokenizing and planning the
next batch while the model runs (``ahead``), once with the inference thread tokenizing each batch
before it runs it (``inline``).  The model takes no CPU, so what differs is whether it waits for
the tokenizer.  The two alternate for ``settings.rounds`` rounds; each row is the middle round.

Then the same pair on the real model: one broker and two real workers of the bundled model (one
torch worker busy at a time, all cores), one with the preparation pool (``--tokenize-ahead``, the
default) and one without, under the same closed-loop ZeroMQ clients, alternating in rounds.  There
the tokenizer and torch share the CPU, so the preparation pool's gain is whatever the tokenizer's
work overlaps with torch's idle moments.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.common import procs
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import zmq_raw_call
from scripts.benchmarks.load.loops import closed_loop
from scripts.benchmarks.systems import accelerator
from worker.config import WorkerConfig
from zbatch.client import AsyncClient
from zbatch.testing import Daemon, Daemons, start_broker, start_worker

CASE = "overlap"
BATCH_MS = 2.0
CLIENTS = 32
MODES = {"ahead": "tokenized in the model's shadow", "inline": "tokenized before each batch"}


def system_name(mode: str) -> str:
    return f"simulated {BATCH_MS:g} ms batch, {MODES[mode]}"


def real_system_name(mode: str) -> str:
    return f"real model, 1 worker, {MODES[mode]}"


def _start_real_pair(daemons: Daemons) -> Daemon:
    """A broker and two workers of the bundled model, named after their modes; returns the broker."""
    broker = daemons.add(start_broker(daemons.log_dir))
    for mode in MODES:
        daemons.add(start_worker(broker, daemons.log_dir, mode, model_name=mode, workers=1,
                                 tokenize_ahead=str(mode == "ahead").lower()))
    return broker


def _append(ctx: Context, name: Callable[[str], str], runs: dict[str, list[dict[str, Any]]]) -> None:
    """One row per mode (its middle round); the ``ahead`` row carries its median ratio to ``inline``."""
    ratios = [a["req_s"] / b["req_s"] for a, b in zip(runs["ahead"], runs["inline"], strict=True) if b["req_s"]]
    for mode, results in runs.items():
        paired = {"vs_inline": statistics.median(ratios)} if mode == "ahead" and ratios else {}
        middle = sorted(results, key=lambda result: result["req_s"])[len(results) // 2]
        ctx.rows.append(row(CASE, name(mode), CLIENTS, middle, mode=mode, paired=paired, rounds=len(results)))


async def overlap(ctx: Context) -> None:
    """Closed-loop clients against the simulated model, its texts tokenized ahead and inline, in rounds; then
    the real model."""
    s = ctx.settings
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    procs.log(f"overlap: {CLIENTS} clients, a model sleeping {BATCH_MS:g} ms a batch behind the real tokenizer")
    for _ in range(s.rounds):
        for mode, results in runs.items():
            results.append(await accelerator.measure(WorkerConfig.max_batch_delay_ms, CLIENTS, s.duration_s, BATCH_MS,
                                               accelerator.ITEM_MS, mode))
    _append(ctx, system_name, runs)
    await _real_model(ctx)


async def _real_model(ctx: Context) -> None:
    """The same pair on the real model: a worker with the preparation pool and one without, in rounds."""
    s = ctx.settings
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    procs.log(f"overlap: {CLIENTS} clients, the real model, tokenized ahead and inline")
    with procs.running() as daemons:
        broker = await procs.start(daemons, _start_real_pair)
        async with AsyncClient(broker.frontend) as client:
            for _ in range(s.rounds):
                for mode, results in runs.items():
                    results.append(await closed_loop(zmq_raw_call(client, mode, shuffled()), CLIENTS, s.warmup_s,
                                                     s.duration_s, watch=daemons.pids()))
    _append(ctx, real_system_name, runs)
