"""Cases with the real model: the ceiling, zbatch over HTTP and ZeroMQ, the two baselines (overload: cases_overload)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from broker.client import AsyncClient
from scripts.benchmarks import procs
from scripts.benchmarks.calls import http_call, http_session, zmq_infer_call
from scripts.benchmarks.common import Context, row
from scripts.benchmarks.load import QUIET, closed_loop, quiet
from scripts.benchmarks.procs import MODEL, ROOT, Procs
from scripts.benchmarks.texts import shuffled


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
