"""Cases past capacity: an open-loop flood (overload) and 512 clients that retry at once (storm).

Both compare what gets served with the capacity measured in the same run
(req/s at concurrency 32), since on a shared 2-core box only ratios travel.
The storm runs against zbatch and against the HF guide's batching done right.

Both also run against zbatch with a *simulated accelerator*: a worker whose
batches take as long as the real model's on this CPU (15 ms + 7 ms per item)
but sleep instead of computing.  On this machine the real model needs both
cores, so clients that retry at once take CPU from it whatever the server
does; with the model's work off the CPU, as on a GPU host, what remains is
what the broker and the gateway make of the storm.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.config import GatewayConfig
from scripts.benchmarks import batches, procs
from scripts.benchmarks.calls import http_call, http_session
from scripts.benchmarks.cases_infra import CPU_CLASS
from scripts.benchmarks.common import Context, row
from scripts.benchmarks.load import closed_loop, open_loop
from scripts.benchmarks.probe import run_probe
from scripts.benchmarks.procs import MODEL
from scripts.benchmarks.texts import shuffled
from zbatch.testing import Daemons

OVERLOAD_FACTOR = 4.0
CAPACITY_CONCURRENCY = 32
STORM_CLIENTS = 512
REFUSED = frozenset({"503"})
ACCELERATOR = "zbatch gateway, simulated accelerator"
PROBE_RATE = 50.0  # requests/s the probe sends during a storm


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
        return await open_loop(http_call(session, url, shuffled()), rate, s.overload_s, s.overload_grace_s)


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
                                       s.overload_grace_s, retry_on=REFUSED, watch=daemons.pids())
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
