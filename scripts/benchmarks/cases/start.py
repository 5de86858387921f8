"""The start case: how long a worker takes from its process start to READY, on a cold start cache and a warm one.

A worker of the default model on the CPU, at its defaults (``--runtime auto``,
the cores ledger), is started again and again beside one broker: *cold*,
each time on a new, empty cache folder (it exports the model, validates the
graph against torch and calibrates); *warm*, each time on one folder that a
start filled first (it reads the verdict and the calibration,
:mod:`worker.runners.start_cache`).  Time to READY runs from spawning the
process to the broker listing the worker, which is what a load balancer or
an autoscaler waits for.  Each start's log line gives its phases
(:mod:`worker.runners.phases`); the run's detail section shows the median of
each.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.common import procs
from scripts.benchmarks.load.loops import quiet
from zbatch.testing import Daemons, spawn, start_broker, wait_for_worker

STARTS = {True: 1, False: 5}  # starts of each kind: --quick, full run
READY_GOAL_S = 3.0  # issue 38: a CPU worker on a warm cache is ready within this
SYSTEMS = {"cold": "worker, cold start cache", "warm": "worker, warm start cache"}
PHASE = re.compile(r"([a-z][a-z -]*?) (\d+\.\d+) s(?: \(([^)]*)\))?(?:, |$)")
PHASES_AFTER = "torch thread(s): "  # the worker's "model ... loaded" line, then its phases


def phases_of(log: str) -> dict[str, float]:
    """The phases of a worker's start, in seconds, from its log (the first model's line)."""
    line = next((line for line in log.splitlines() if PHASES_AFTER in line), "")
    return {name: float(seconds) for name, seconds, _ in PHASE.findall(line.split(PHASES_AFTER, 1)[-1])}


def _start_once(daemons: Daemons, broker: Any, name: str, cache: Path) -> tuple[float, dict[str, float]]:
    """Seconds from spawning a worker to the broker listing it, and its phases; the worker is stopped after."""
    started = time.monotonic()
    worker = spawn("worker", name, daemons.log_dir, backend=broker.backend, name=name, device="cpu",
                   cores_ledger=str(daemons.log_dir / "cores"), onnx_cache=str(cache))
    try:
        wait_for_worker(broker, worker)
        seconds = time.monotonic() - started
    finally:
        worker.stop()
    return seconds, phases_of(worker.log_path.read_text(errors="replace"))


def _summary(kind: str, runs: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    seconds = [each for each, _ in runs]
    names = list(dict.fromkeys(name for _, phases in runs for name in phases))
    medians = {name: statistics.median(phases.get(name, 0.0) for _, phases in runs) for name in names}
    return {"kind": kind, "starts": len(runs), "ready_s": seconds, "min_s": min(seconds),
            "median_s": statistics.median(seconds), "max_s": max(seconds), "phases_median_s": medians}


async def start(ctx: Context) -> None:
    """Cold and warm starts, alternating, so that both meet the same host."""
    count = STARTS[ctx.settings.quick]
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {kind: [] for kind in SYSTEMS}
    with procs.running() as daemons, tempfile.TemporaryDirectory(prefix="zbatch-start-") as scratch:
        broker = daemons.add(await procs.blocking(start_broker, daemons.log_dir))
        warm = Path(scratch) / "warm"
        procs.log(f"start: filling a start cache, then {count} cold and {count} warm worker starts")
        await procs.blocking(_start_once, daemons, broker, "fill", warm)
        for i in range(count):
            for kind in SYSTEMS:
                await quiet()
                cache = warm if kind == "warm" else Path(scratch) / f"cold{i}"
                runs[kind].append(await procs.blocking(_start_once, daemons, broker, f"{kind}{i}", cache))
    for kind, system in SYSTEMS.items():
        summary = _summary(kind, runs[kind])
        procs.log(f"start: {system}: READY in {summary['min_s']:.2f} s at least, {summary['median_s']:.2f} s median")
        ctx.rows.append(row("start", system, "–", {}, **summary))


def section(rows: list[dict[str, Any]]) -> list[str]:
    """The detail section of this run's worker starts (nothing if the case did not run)."""
    start_rows = [r for r in rows if r["case"] == "start"]
    if not start_rows:
        return []
    names = list(dict.fromkeys(name for r in start_rows for name in r["detail"]["phases_median_s"]))
    lines = ["", "### Worker start", "", "A worker of the default model on the CPU at its defaults, started beside "
             "one broker, alternately on a new, empty start cache (cold) and on one that a start filled first "
             "(warm); seconds from spawning the worker to the broker listing it, and the median of each phase its "
             "log line gives (`worker/runners/phases.py`; imports: torch and transformers, after the worker's own).",
             "", "| start | starts | READY min / median / max s | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for r in start_rows:
        d = r["detail"]
        phases = [f"{d['phases_median_s'][name]:.2f}" if name in d["phases_median_s"] else "–" for name in names]
        lines.append(f"| {r['system']} | {d['starts']} | {d['min_s']:.2f} / {d['median_s']:.2f} / {d['max_s']:.2f} "
                     "| " + " | ".join(phases) + " |")
    return lines


def targets(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, bool | None]]:
    """Issue 38's start target: READY on a warm cache within :data:`READY_GOAL_S`."""
    warm = next((r for r in rows if r["case"] == "start" and r["system"] == SYSTEMS["warm"]), None)
    if warm is None:
        return []
    cold = next((r for r in rows if r["case"] == "start" and r["system"] == SYSTEMS["cold"]), None)
    measured = f"{warm['detail']['median_s']:.2f} s median" + (
        f" ({cold['detail']['median_s']:.2f} s cold)" if cold else "")
    return [("CPU worker ready, warm start cache", f"≤ {READY_GOAL_S:g} s from process start to READY", measured,
             warm["detail"]["median_s"] <= READY_GOAL_S)]
