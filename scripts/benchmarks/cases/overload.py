"""Cases past capacity: an open-loop flood (overload), 512 clients that retry at once (storm), and corpus
uploads that follow Retry-After (shed).

Both compare what gets served with the capacity measured in the same run
(req/s at concurrency 32), since on a shared 2-core box only ratios travel.
The storm runs against zbatch and against the HF guide's batching done right.

Both also run against zbatch with a *simulated accelerator*: a worker whose
batches take as long as the real model's on this CPU (15 ms + 7 ms per item)
but sleep instead of computing.  On this machine the real model needs both
cores, so clients that retry at once take CPU from it whatever the server
does; with the model's work off the CPU, as on a GPU host, what remains is
what the broker and the gateway make of the storm.

The shed case is issue 33's two loads, closed-loop clients sending 32 texts a request: 16 of them against
the stack ``scripts/serve`` ships (every one should be answered within the default deadline), then 64
against one worker with a 5 s deadline (``X-Request-Timeout-Ms``), where waiting would pass it.  A
refused client waits the answer's Retry-After (up to a tenth more, as jitter) and sends the same request
again.  Goodput is over the texts/s of the same 64 clients on the same stack with the default deadline
(30 s, which they fit: nothing refused), measured just before.  Both loads run again on a simulated
accelerator (an echo worker whose batch of up to 32 takes 2 ms) with a 50 ms deadline, which 64 clients
of 32 texts do not fit either.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from typing import Any

import aiohttp
import numpy as np

from gateway.config import GatewayConfig
from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.cases.infra import CPU_CLASS
from scripts.benchmarks.common import batches, procs
from scripts.benchmarks.common.procs import MODEL
from scripts.benchmarks.common.texts import sentences, shuffled
from scripts.benchmarks.load.calls import http_call, http_session
from scripts.benchmarks.load.loops import closed_loop, open_loop, quiet
from scripts.benchmarks.load.probe import run_probe
from zbatch.testing import Daemons

OVERLOAD_FACTOR = 4.0
CAPACITY_CONCURRENCY = 32
STORM_CLIENTS = 512
REFUSED = frozenset({"503"})
ACCELERATOR = "zbatch gateway, simulated accelerator"
PROBE_RATE = 50.0  # requests/s the probe sends during a storm


def grace_s(ctx: Context) -> float:
    """How long answers are waited for after the window: past the deadline, since the broker admits
    whatever it predicts to answer within it (a request still waiting then is really unanswered)."""
    return max(ctx.settings.overload_grace_s, GatewayConfig.timeout_ms / 1000 + 5)


async def capacity(ctx: Context, case: str, url: str) -> float:
    """req/s of ``case`` at concurrency 32 in this run, measured now (once) if that case did not run."""
    found = ctx.find(case, concurrency=CAPACITY_CONCURRENCY)
    if found is not None:
        return float(found["req_s"] or 1.0)
    if case not in ctx.capacities:
        s = ctx.settings
        procs.log(f"measuring capacity first ({case} at concurrency {CAPACITY_CONCURRENCY})")
        async with http_session(limit=CAPACITY_CONCURRENCY) as session:
            result = await closed_loop(http_call(session, url, shuffled()), CAPACITY_CONCURRENCY,
                                       s.warmup_s, s.duration_s)
        ctx.capacities[case] = float(result["req_s"] or 1.0)
    return ctx.capacities[case]


def _start_accelerator(daemons: Daemons) -> str:
    """Broker, one simulated accelerator worker, gateway; returns the URL to POST to."""
    broker = procs.start_echo_system(daemons, 1, *CPU_CLASS.flags(), "--outputs", "vector")
    return f"{procs.start_deployed_gateway(daemons, broker)}/models/{MODEL}"


async def _overload(ctx: Context, system: str, url: str, measured: float) -> dict[str, Any]:
    s = ctx.settings
    rate = OVERLOAD_FACTOR * measured
    procs.log(f"overload: {system}: {rate:.0f} req/s offered (4 x {measured:.0f}) for {s.overload_s:.0f} s")
    async with http_session(limit=4096) as session:
        return await open_loop(http_call(session, url, shuffled()), rate, s.overload_s, grace_s(ctx))


def _overload_row(system: str, result: dict[str, Any], measured: float, **detail: Any) -> dict[str, Any]:
    refused = result["all_latency_by_status"].get("503", {})
    return row("overload", system, f"{OVERLOAD_FACTOR * measured:.0f}/s offered", result, capacity_req_s=measured,
               factor=OVERLOAD_FACTOR, p99_503_ms=refused.get("p99_ms"), **detail)


async def overload(ctx: Context) -> None:
    """Open loop at 4x the measured capacity: does zbatch keep serving, and refuse the rest quickly?"""
    stack = await ctx.zbatch()
    measured = await capacity(ctx, "zbatch-http", stack.url)
    await stack.wait_idle()
    before = await stack.batches()
    result = await _overload(ctx, "zbatch gateway", stack.url, measured)
    ctx.rows.append(_overload_row("zbatch gateway, open loop", result, measured,
                                  worker_batches=batches.difference(before, await stack.batches())))
    await stack.wait_idle()
    with procs.running() as daemons:
        url = await procs.start(daemons, _start_accelerator)
        measured = await capacity(ctx, ACCELERATOR, url)
        ctx.rows.append(_overload_row(f"{ACCELERATOR}, open loop", await _overload(ctx, ACCELERATOR, url, measured),
                                      measured))


async def _storm(ctx: Context, url: str, measured: float, daemons: Daemons
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """512 closed-loop clients over 512 connections, each sending again at once when refused (503).

    A probe in its own process times the answers meanwhile (see probe.py): the storm's
    clients saturate their own event loop, which adds its queueing to what they measure.
    """
    s = ctx.settings
    probing = asyncio.create_task(run_probe(url, PROBE_RATE, s.warmup_s, s.overload_s))
    try:
        async with http_session(limit=0) as session:
            result = await closed_loop(http_call(session, url, shuffled()), STORM_CLIENTS, s.warmup_s, s.overload_s,
                                       grace_s(ctx), retry_on=REFUSED, watch=daemons.pids())
        probe = await probing
    finally:
        probing.cancel()
    answers = result["answers"]["latency_by_status"]
    # Not an HTTP status: a timeout or a broken connection. Abandoned: no answer within the grace period.
    lost = sum(n for status, n in result["all_statuses"].items() if status != "ok" and not status.isdigit())
    refused_at_end = result["all_statuses"].get("503", 0)  # still refused when the window closed: never admitted
    detail = {"capacity_req_s": measured, "refused_503": answers.get("503", {}).get("n", 0),
              "p99_503_ms": probe["latency_by_status"].get("503", {}).get("p99_ms"),
              "p99_503_ms_storm_clients": answers.get("503", {}).get("p99_ms"), "probe": probe,
              "accepted_p99_ms": answers.get("ok", {}).get("p99_ms"), "deadline_ms": GatewayConfig.timeout_ms,
              "unanswered": result["abandoned"] + lost, "never_admitted": refused_at_end}
    return result, detail


async def storm(ctx: Context) -> None:
    """512 clients that retry at once on 503: zbatch, the guide's batching, zbatch on a simulated accelerator."""
    stack = await ctx.zbatch()
    measured = await capacity(ctx, "zbatch-http", stack.url)
    procs.log(f"storm: {STORM_CLIENTS} clients retrying at once on 503, zbatch gateway (capacity {measured:.0f} req/s)")
    await stack.wait_idle()
    before = await stack.batches()
    result, detail = await _storm(ctx, stack.url, measured, stack.daemons)
    ctx.rows.append(row("storm", "zbatch gateway", STORM_CLIENTS, result, **detail,
                        worker_batches=batches.difference(before, await stack.batches())))
    await stack.wait_idle()

    baseline = await ctx.baseline("batched")
    measured = await capacity(ctx, "baseline-batched", baseline.url)
    procs.log(f"storm: {STORM_CLIENTS} clients retrying at once on 503, HF guide batched (capacity {measured:.0f})")
    result, detail = await _storm(ctx, baseline.url, measured, baseline.daemons)
    ctx.rows.append(row("storm", "HF guide, batched", STORM_CLIENTS, result, **detail))

    with procs.running() as daemons:
        url = await procs.start(daemons, _start_accelerator)
        measured = await capacity(ctx, ACCELERATOR, url)
        procs.log(f"storm: {STORM_CLIENTS} clients retrying at once on 503, {ACCELERATOR} (capacity {measured:.0f})")
        result, detail = await _storm(ctx, url, measured, daemons)
        ctx.rows.append(row("storm", ACCELERATOR, STORM_CLIENTS, result, **detail))


SHED_TEXTS = 32
SHED_FIT, SHED_OVER = 16, 64  # clients
SHED_DEADLINE_MS = 5_000
SHED_WARMUP_S, SHED_S = 5.0, 40.0  # the 40 s; a warm-up long enough for the broker to measure the rate
ACCELERATOR_BATCH_MS = 2.0  # the simulated accelerator's batch of up to 32 texts
ACCELERATOR_DEADLINE_MS = 50  # 2,048 texts take 128 ms there: a deadline they pass, as 5 s on this CPU


def _p(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


async def corpus_clients(url: str, clients: int, warmup_s: float, duration_s: float,
                         deadline_ms: int | None = None) -> dict[str, Any]:
    """``clients`` closed-loop clients of ``SHED_TEXTS`` texts a request that follow Retry-After on a 503;
    the figures of the answers that came within the window after ``warmup_s``."""
    texts = sentences()
    headers = {"Content-Type": "application/json"} | ({"X-Request-Timeout-Ms": str(deadline_ms)} if deadline_ms
                                                      else {})
    answers: list[dict[str, Any]] = []
    start = time.perf_counter()
    window = (start + warmup_s, start + warmup_s + duration_s)

    async def client(number: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(number)
        while time.perf_counter() < window[1]:
            body = json.dumps({"inputs": rng.sample(texts, SHED_TEXTS)}).encode()
            retry = False
            while True:
                sent = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        await response.read()
                        status, hint = str(response.status), response.headers.get("Retry-After")
                except (TimeoutError, aiohttp.ClientError) as exc:
                    status, hint = type(exc).__name__, None
                done = time.perf_counter()
                answers.append({"client": number, "sent": sent, "done": done, "status": status, "retry": retry,
                                "retry_after": hint})
                if status != "503" or done >= window[1]:
                    break
                retry = True
                await asyncio.sleep(float(hint or 1) * rng.uniform(1.0, 1.1))

    await quiet()
    async with http_session(limit=0) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    inside = [a for a in answers if window[0] <= a["done"] <= window[1]]
    ms = {status: [(a["done"] - a["sent"]) * 1000 for a in inside if a["status"] == status]
          for status in {a["status"] for a in inside}}
    ok = ms.get("200", [])
    retries = [a for a in inside if a["retry"]]
    admitted = {a["client"] for a in inside if a["status"] == "200"}
    return {"clients": clients, "deadline_ms": deadline_ms, "duration_s": duration_s,
            "req_s": len(ok) / duration_s, "texts_s": len(ok) * SHED_TEXTS / duration_s,
            "p50_ms": _p(ok, 50), "p99_ms": _p(ok, 99), "statuses": dict(Counter(a["status"] for a in inside)),
            "accepted_p99_ms": _p(ok + ms.get("504", []), 99),  # admitted: answered, or late
            "p50_503_ms": _p(ms.get("503", []), 50), "p99_503_ms": _p(ms.get("503", []), 99),
            "retries": len(retries), "retries_admitted": sum(1 for a in retries if a["status"] == "200"),
            "clients_admitted": len(admitted),
            "retry_after_s": dict(Counter(a["retry_after"] for a in inside if a["status"] == "503")),
            "errors": len(inside) - len(ok)}


def _start_accelerator_system(daemons: Daemons) -> str:
    """Broker, one simulated accelerator (2 ms a batch of up to 32), gateway; returns the URL to POST to."""
    flags = ("--batch-ms", str(ACCELERATOR_BATCH_MS), "--item-ms", "0", "--max-batch", str(SHED_TEXTS),
             "--capacity", str(2 * SHED_TEXTS), "--outputs", "vector")
    broker = procs.start_echo_system(daemons, 1, *flags)
    return f"{procs.start_deployed_gateway(daemons, broker)}/models/{MODEL}"


async def _shed_rows(ctx: Context, system: str, fit_url: str, one_url: str, deadline_ms: int) -> None:
    """The two loads: SHED_FIT clients on ``fit_url``; then on ``one_url`` (one worker) its capacity (SHED_OVER
    clients with the default deadline, which they fit; SHED_FIT in a quick run) and SHED_OVER clients with
    ``deadline_ms``, which they do not."""
    warmup_s, duration_s = (1.0, 4.0) if ctx.settings.quick else (SHED_WARMUP_S, SHED_S)
    procs.log(f"shed: {system}: {SHED_FIT} clients x {SHED_TEXTS} texts for {duration_s:.0f} s")
    fit = await corpus_clients(fit_url, SHED_FIT, warmup_s, duration_s)
    ctx.rows.append(row("shed", f"{system}, {SHED_FIT} x {SHED_TEXTS}", SHED_FIT, fit))
    # Quick: the capacity with SHED_FIT clients, who keep the worker's batches full as well, so that its window is
    # not followed by the 16 s that SHED_OVER clients' last requests take on a 2-core CPU.
    capacity_clients = SHED_FIT if ctx.settings.quick else SHED_OVER
    capacity = await corpus_clients(one_url, capacity_clients, warmup_s, duration_s / 4)
    procs.log(f"shed: {system}: {SHED_OVER} clients x {SHED_TEXTS} texts, {deadline_ms} ms deadline "
              f"(capacity {capacity['texts_s']:.0f} texts/s)")
    over = await corpus_clients(one_url, SHED_OVER, warmup_s, duration_s, deadline_ms)
    ctx.rows.append(row("shed", f"{system}, one worker, {SHED_OVER} x {SHED_TEXTS}, {deadline_ms} ms deadline",
                        SHED_OVER, over, capacity_texts_s=capacity["texts_s"]))


async def shed(ctx: Context) -> None:
    """Issue 33's loads: corpus uploads that fit the deadline are all answered; those that do not are refused
    at once with a Retry-After that a client following it gets in on."""
    serve = await ctx.serve()
    one = await ctx.zbatch()
    await _shed_rows(ctx, "zbatch", serve.url, one.url, SHED_DEADLINE_MS)
    await ctx.release(set())
    with procs.running() as daemons:
        url = await procs.start(daemons, _start_accelerator_system)
        await _shed_rows(ctx, "zbatch, simulated accelerator", url, url, ACCELERATOR_DEADLINE_MS)
