"""Cases with the real model: the ceiling, zbatch over HTTP and ZeroMQ, the two baselines, overload."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from broker.client import AsyncClient
from scripts.benchmarks import procs
from scripts.benchmarks.common import Context, row
from scripts.benchmarks.load import QUIET, closed_loop, http_call, http_session, open_loop, quiet, zmq_infer_call
from scripts.benchmarks.procs import MODEL, ROOT, Procs
from scripts.benchmarks.texts import shuffled

OVERLOAD_FACTOR = 4.0


async def limit(ctx: Context) -> None:
    """The model in a tight loop in its own process: what any server on this box can approach at best."""
    s = ctx.settings
    procs.log("limit: model called directly at batch 1, 8, 32")
    await quiet()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scripts.benchmarks.limit", "--warmup-s", str(s.warmup_s),
        "--duration-s", str(s.duration_s), "--quiet-wait", str(QUIET["wait_s"]), "--retries", str(QUIET["retries"]),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the limit subprocess failed with exit code {proc.returncode}")
    data = json.loads(out)
    for result in data["results"]:
        ctx.rows.append(row("limit", f"direct, batch {result['batch_size']}", "-", result, torch=data["torch"]))


async def _closed_http(ctx: Context, case: str, system: str, url: str, concurrency: tuple[int, ...],
                       batch_log: Any = None) -> None:
    s = ctx.settings
    for c in concurrency:
        procs.log(f"{case}: {system} at concurrency {c}")
        since = batch_log.log_offset() if batch_log else 0
        async with http_session(limit=c) as session:
            result = await closed_loop(http_call(session, url, shuffled()), c, s.warmup_s, s.duration_s)
        extra = {"worker_batches": batch_log.batch_sizes(since)} if batch_log else {}
        ctx.rows.append(row(case, system, c, result, **extra))


async def zbatch_http(ctx: Context) -> None:
    stack = await ctx.zbatch()
    await _closed_http(ctx, "zbatch-http", "zbatch gateway", stack.url, ctx.settings.concurrency, stack)


async def zbatch_zmq(ctx: Context) -> None:
    stack = await ctx.zbatch()
    s = ctx.settings
    async with AsyncClient(stack.frontend) as client:
        for c in s.concurrency:
            procs.log(f"zbatch-zmq: AsyncClient at concurrency {c}")
            since = stack.log_offset()
            result = await closed_loop(zmq_infer_call(client, MODEL, shuffled()), c, s.warmup_s, s.duration_s)
            ctx.rows.append(row("zbatch-zmq", "zbatch AsyncClient", c, result,
                                worker_batches=stack.batch_sizes(since)))


async def _baseline(ctx: Context, mode: str) -> None:
    p = Procs()
    try:
        procs.log(f"baseline-{mode}: starting the server (loads the model)")
        url = await procs.start_http_server(p, "scripts.benchmarks.baselines", f"baseline-{mode}", mode,
                                            "--threads", "2")
        await _closed_http(ctx, f"baseline-{mode}", f"HF guide, {mode}", f"{url}/models/{MODEL}",
                           ctx.settings.concurrency)
    finally:
        p.close()


async def baseline_naive(ctx: Context) -> None:
    await _baseline(ctx, "naive")


async def baseline_batched(ctx: Context) -> None:
    await _baseline(ctx, "batched")


async def overload(ctx: Context) -> None:
    """Open loop at 4x the measured capacity: does zbatch keep serving, and refuse the rest quickly?"""
    s = ctx.settings
    stack = await ctx.zbatch()
    measured = ctx.find("zbatch-http", concurrency=32)
    if measured is None:
        procs.log("overload: measuring capacity first (zbatch-http at concurrency 32)")
        async with http_session(limit=32) as session:
            measured = {"req_s": (await closed_loop(http_call(session, stack.url, shuffled()), 32,
                                                    s.warmup_s, s.duration_s))["req_s"]}
    capacity = float(measured["req_s"] or 1.0)
    rate = OVERLOAD_FACTOR * capacity
    procs.log(f"overload: {rate:.0f} req/s offered (4 x {capacity:.0f}) for {s.overload_s:.0f} s, open loop")
    since = stack.log_offset()
    async with http_session(limit=4096) as session:
        result = await open_loop(http_call(session, stack.url, shuffled()), rate, s.overload_s, s.overload_grace_s)
    refused = result["all_latency_by_status"].get("503", {})
    ctx.rows.append(row("overload", "zbatch gateway, open loop", f"{rate:.0f}/s offered", result,
                        capacity_req_s=capacity, factor=OVERLOAD_FACTOR, p99_503_ms=refused.get("p99_ms"),
                        worker_batches=stack.batch_sizes(since)))
