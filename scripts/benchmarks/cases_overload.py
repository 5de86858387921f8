"""Cases past capacity: an open-loop flood (overload) and 512 clients that retry at once (storm).

Both compare what gets served with the capacity measured in the same run
(req/s at concurrency 32), since on a shared 2-core box only ratios travel.
The storm runs against zbatch and against the HF guide's batching done right.
"""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from scripts.benchmarks import procs
from scripts.benchmarks.calls import http_call, http_session
from scripts.benchmarks.common import Context, ZbatchStack, row
from scripts.benchmarks.load import closed_loop, open_loop
from scripts.benchmarks.procs import MODEL, Procs
from scripts.benchmarks.texts import shuffled

OVERLOAD_FACTOR = 4.0
CAPACITY_CONCURRENCY = 32
STORM_CLIENTS = 512
REFUSED = frozenset({"503"})


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


async def overload(ctx: Context) -> None:
    """Open loop at 4x the measured capacity: does zbatch keep serving, and refuse the rest quickly?"""
    s = ctx.settings
    stack = await ctx.zbatch()
    measured = await capacity(ctx, "zbatch-http", stack.url)
    rate = OVERLOAD_FACTOR * measured
    procs.log(f"overload: {rate:.0f} req/s offered (4 x {measured:.0f}) for {s.overload_s:.0f} s, open loop")
    await stack.wait_idle()
    since = stack.log_offset()
    async with http_session(limit=4096) as session:
        result = await open_loop(http_call(session, stack.url, shuffled()), rate, s.overload_s, s.overload_grace_s)
    refused = result["all_latency_by_status"].get("503", {})
    ctx.rows.append(row("overload", "zbatch gateway, open loop", f"{rate:.0f}/s offered", result,
                        capacity_req_s=measured, factor=OVERLOAD_FACTOR, p99_503_ms=refused.get("p99_ms"),
                        worker_batches=stack.batch_sizes(since)))


async def _storm(ctx: Context, url: str, measured: float, p: Procs) -> tuple[dict[str, Any], dict[str, Any]]:
    """512 closed-loop clients over 512 connections, each sending again at once when refused (503)."""
    s = ctx.settings
    async with http_session(limit=0) as session:
        result = await closed_loop(http_call(session, url, shuffled()), STORM_CLIENTS, s.warmup_s, s.overload_s,
                                   s.overload_grace_s, retry_on=REFUSED, watch=p.pids())
    answers = result["answers"]["latency_by_status"]
    # Not an HTTP status: a timeout or a broken connection. Abandoned: still retrying after the grace period.
    lost = sum(n for status, n in result["all_statuses"].items() if status != "ok" and not status.isdigit())
    detail = {"capacity_req_s": measured, "refused_503": answers.get("503", {}).get("n", 0),
              "p99_503_ms": answers.get("503", {}).get("p99_ms"),
              "accepted_p99_ms": answers.get("ok", {}).get("p99_ms"), "deadline_ms": GatewayConfig.timeout_ms,
              "unanswered": result["abandoned"] + lost}
    return result, detail


async def _storm_zbatch(ctx: Context, stack: ZbatchStack) -> None:
    measured = await capacity(ctx, "zbatch-http", stack.url)
    procs.log(f"storm: {STORM_CLIENTS} clients retrying at once on 503, zbatch gateway (capacity {measured:.0f} req/s)")
    await stack.wait_idle()
    since = stack.log_offset()
    result, detail = await _storm(ctx, stack.url, measured, stack.procs)
    ctx.rows.append(row("storm", "zbatch gateway", STORM_CLIENTS, result, **detail,
                        worker_batches=stack.batch_sizes(since)))
    await stack.wait_idle()


async def _storm_baseline(ctx: Context) -> None:
    p = Procs()
    try:
        procs.log("storm: starting the HF guide's batched server (loads the model)")
        url = await procs.start_http_server(p, "scripts.benchmarks.baselines", "baseline-batched", "batched",
                                            "--threads", "2")
        url = f"{url}/models/{MODEL}"
        measured = await capacity(ctx, "baseline-batched", url)
        procs.log(f"storm: {STORM_CLIENTS} clients retrying at once on 503, HF guide batched "
                  f"(capacity {measured:.0f} req/s)")
        result, detail = await _storm(ctx, url, measured, p)
        ctx.rows.append(row("storm", "HF guide, batched", STORM_CLIENTS, result, **detail))
    finally:
        p.close()


async def storm(ctx: Context) -> None:
    """512 clients that retry at once on 503: zbatch, then the guide's batching, each against its capacity."""
    await _storm_zbatch(ctx, await ctx.zbatch())
    await _storm_baseline(ctx)
