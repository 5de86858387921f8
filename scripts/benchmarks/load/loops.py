"""One load generator for every system: closed loop (fixed concurrency) and open loop (fixed rate).

A *call* is any coroutine that sends one request and returns its status
("ok" or what went wrong), so the HTTP systems, the ZeroMQ client and the
raw routing benchmarks (see calls.py) all go through the same loops and the
same statistics. The closed loop can also retry: a storm of clients that send
again at once when refused.
Latency is measured from when a request was due (open loop: its scheduled
arrival, not when the generator got round to it), so queueing in the
generator itself is not hidden.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from scripts.benchmarks.common import cpu
from scripts.benchmarks.common.procs import log

Call = Callable[[], Awaitable[str]]
# Set once by the runner: how long to wait for other processes to go idle before a measurement,
# and how often to measure again when they disturbed it anyway (0 and 0: just record the noise).
QUIET = {"wait_s": 0.0, "retries": 0}


async def quiet() -> None:
    """Hold the next measurement while other processes keep the CPU busy (see cpu.wait_quiet)."""
    if QUIET["wait_s"] > 0:
        await cpu.wait_quiet(QUIET["wait_s"], log)


async def settled(measure: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Run ``measure`` on a quiet machine; measure again if other processes still disturbed it.

    Keeps the least disturbed attempt, which carries its ``other_cores`` into the table.
    """
    attempts = 1 + int(QUIET["retries"])
    best: dict[str, Any] | None = None
    for attempt in range(1, attempts + 1):
        await quiet()
        result = await measure() | {"attempts": attempt}
        other = result.get("other_cores") or 0.0
        if best is None or other < (best.get("other_cores") or 0.0):
            best = result
        if other < cpu.QUIET_CORES:
            break
        if attempt < attempts:
            log(f"other processes used {other:.2f} cores during that measurement; measuring again")
    assert best is not None
    return best


@dataclass(slots=True)
class Sample:
    start: float
    end: float
    status: str


def _percentiles(latencies_ms: list[float]) -> dict[str, float | None]:
    if not latencies_ms:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    values = np.asarray(latencies_ms)
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50_ms": float(p50), "p90_ms": float(p90), "p99_ms": float(p99),
            "max_ms": float(values.max()), "mean_ms": float(values.mean())}


def summarize(samples: list[Sample], window: tuple[float, float], items: int = 1) -> dict[str, Any]:
    """Throughput and latency of the requests that finished inside ``window``."""
    start, end = window
    inside = [s for s in samples if start <= s.end <= end]
    ok = [(s.end - s.start) * 1000 for s in inside if s.status == "ok"]
    duration = end - start
    by_status: dict[str, list[float]] = {}
    for s in inside:
        by_status.setdefault(s.status, []).append((s.end - s.start) * 1000)
    return {
        "duration_s": duration, "requests": len(inside), "ok": len(ok), "errors": len(inside) - len(ok),
        "req_s": len(ok) / duration, "texts_s": len(ok) * items / duration, **_percentiles(ok),
        "statuses": dict(Counter(s.status for s in inside)),
        "latency_by_status": {k: {"n": len(v), **_percentiles(v)} for k, v in by_status.items()},
    }


async def _status(call: Call) -> str:
    try:
        return await call()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a call should return its status, but never lose a sample
        return type(exc).__name__


async def _timed(call: Call, start: float, samples: list[Sample]) -> None:
    status = await _status(call)
    samples.append(Sample(start, time.perf_counter(), status))


async def _request(call: Call, retry_on: frozenset[str], attempts: list[Sample], retry_until: float) -> Sample:
    """One request, sent again at once while its answer is in ``retry_on`` (until ``retry_until``).

    Each answer goes to ``attempts``; the sample runs from the first send to the final answer.
    """
    first = time.perf_counter()
    while True:
        sent = time.perf_counter()
        status = await _status(call)
        attempt = Sample(sent, time.perf_counter(), status)
        attempts.append(attempt)
        if status not in retry_on or attempt.end >= retry_until:
            return Sample(first, attempt.end, status)


async def closed_loop(call: Call, concurrency: int, warmup_s: float, duration_s: float, drain_s: float = 30.0,
                      *, retry_on: frozenset[str] = frozenset(), watch: dict[str, int] | None = None
                      ) -> dict[str, Any]:
    """``concurrency`` users each send, wait, send again; only the window after warm-up counts.

    With ``retry_on`` (e.g. {"503"}) a refused request is sent again at once, until the window ends;
    it is one sample from its first send to its final answer, and ``answers`` times every answer on
    its own (its "ok" latency runs from the send that was accepted).  Users still waiting
    ``drain_s`` after the window are cancelled and counted as ``abandoned``: their request got no
    answer.  ``watch`` (name: pid of the processes under test) adds each one's CPU per request
    (per answer, with retries), the load generator's included.
    """
    return await settled(lambda: _closed_loop(call, concurrency, warmup_s, duration_s, drain_s, retry_on, watch))


async def _closed_loop(call: Call, concurrency: int, warmup_s: float, duration_s: float, drain_s: float,
                       retry_on: frozenset[str], watch: dict[str, int] | None) -> dict[str, Any]:
    samples: list[Sample] = []
    attempts: list[Sample] = []
    t0 = time.perf_counter()
    window = (t0 + warmup_s, t0 + warmup_s + duration_s)

    Use = tuple[dict[str, float], dict[str, float]]

    async def monitor() -> tuple[dict[str, float], Use, Use]:
        """Other processes' cores during the window; the watched processes' CPU seconds and sleeps at both ends."""
        await asyncio.sleep(warmup_s)
        start, used = cpu.snapshot(), cpu.process_use(watch or {})
        await asyncio.sleep(duration_s)
        return cpu.usage(start, cpu.snapshot()), used, cpu.process_use(watch or {})

    async def user() -> None:
        while time.perf_counter() < window[1]:
            samples.append(await _request(call, retry_on, attempts, window[1]))

    noise = asyncio.create_task(monitor())
    tasks = [asyncio.create_task(user()) for _ in range(concurrency)]
    # Let requests in flight at the end finish, so the next run starts on an idle system.
    _, pending = await asyncio.wait(tasks, timeout=warmup_s + duration_s + drain_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    late = [s for s in samples if s.end > window[1]]  # a few are normal: those in flight at the end
    result = summarize(samples, window)
    usage, used_start, used_end = await noise
    if retry_on:
        result["answers"] = summarize(attempts, window)
    if watch is not None:  # with retries, per answer: the refusals are where the CPU goes
        per, count = ("answer", result["answers"]["requests"]) if retry_on else ("req", result["requests"])
        (seconds_start, sleeps_start), (seconds_end, sleeps_end) = used_start, used_end
        result[f"cpu_us_per_{per}"] = cpu.per_request(seconds_start, seconds_end, count, 1e6)
        result[f"sleeps_per_{per}"] = cpu.per_request(sleeps_start, sleeps_end, count)
    return result | usage | {
        "concurrency": concurrency, "abandoned": len(pending), "late": len(late),
        "late_max_ms": max(((s.end - s.start) * 1000 for s in late), default=None),
        "all_statuses": dict(Counter(s.status for s in samples))}


async def open_loop(call: Call, rate: float, duration_s: float, grace_s: float,
                    poisson: bool = True, seed: int = 0) -> dict[str, Any]:
    """Requests arrive at ``rate``/s whatever happens to earlier ones (Poisson or evenly spaced).

    After ``duration_s`` no more are sent; those still unanswered ``grace_s``
    later are counted as unanswered and cancelled.
    """
    return await settled(lambda: _open_loop(call, rate, duration_s, grace_s, poisson, seed))


async def _open_loop(call: Call, rate: float, duration_s: float, grace_s: float,
                     poisson: bool, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    samples: list[Sample] = []
    tasks: set[asyncio.Task[None]] = set()
    start = cpu.snapshot()
    t0 = due = time.perf_counter()
    end = t0 + duration_s
    sent = 0
    while True:
        due += rng.expovariate(rate) if poisson else 1.0 / rate
        if due >= end:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_timed(call, due, samples))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    noise = cpu.usage(start, cpu.snapshot())
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=grace_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    everything = summarize(samples, (t0, float("inf")))
    return summarize(samples, (t0, end)) | {
        "offered_rate": rate, "sent": sent, "answered": len(samples), "unanswered": len(pending),
        "all_statuses": everything["statuses"], "all_latency_by_status": everything["latency_by_status"],
    } | noise
