"""Cases without the model: what the broker and the gateway cost, and how the broker spreads work.

Echo workers answer at once, so whatever latency and throughput remain
belong to the client, the routing layer and (for ``gateway``) HTTP.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import aiohttp

from broker.client import AsyncClient, ZBatchError
from scripts.benchmarks import procs
from scripts.benchmarks.common import Context, row
from scripts.benchmarks.load import closed_loop, http_call, http_session, zmq_raw_call
from scripts.benchmarks.procs import MODEL, Procs
from scripts.benchmarks.texts import shuffled

ECHO_WORKERS = 2
SIM = ("--batch-ms", "5", "--item-ms", "0.2", "--max-batch", "32", "--capacity", "64")


async def _zmq_runs(ctx: Context, case: str, system: str, frontend: str, concurrency: tuple[int, ...]) -> None:
    s = ctx.settings
    async with AsyncClient(frontend) as client:
        for c in concurrency:
            procs.log(f"{case}: {system} at concurrency {c}")
            result = await closed_loop(zmq_raw_call(client, MODEL, shuffled()), c, s.warmup_s, s.duration_s)
            ctx.rows.append(row(case, system, c, result))


async def _answers(frontend: str) -> bool:
    try:
        async with AsyncClient(frontend, connect_timeout_ms=300) as client:
            reply = await client.request(MODEL, b"\x80", items=1, timeout_ms=300)
            return reply.status.value == "ok"
    except ZBatchError:
        return False


async def routing(ctx: Context) -> None:
    """The zbatch broker vs libzmq's zmq.proxy, each with 2 instant echo workers and the same client."""
    p = Procs()
    try:
        procs.log(f"routing: zbatch broker with {ECHO_WORKERS} echo workers")
        frontend, backend = await procs.start_broker(p)
        await procs.start_echo_workers(p, frontend, backend, ECHO_WORKERS)
        await _zmq_runs(ctx, "routing", "zbatch broker", frontend, ctx.settings.side_concurrency)
    finally:
        p.close()
    p = Procs()
    try:
        procs.log(f"routing: zmq.proxy with {ECHO_WORKERS} echo workers")
        frontend, backend = procs.endpoint(), procs.endpoint()
        p.spawn("scripts.benchmarks.echo_worker", "proxy", "proxy", "--frontend", frontend, "--backend", backend)
        for i in range(ECHO_WORKERS):
            p.spawn("scripts.benchmarks.echo_worker", f"proxy-echo{i}", "proxy-worker", "--backend", backend)
        await p.wait(lambda: _answers(frontend), "zmq.proxy and its echo workers to answer")
        await _zmq_runs(ctx, "routing", "zmq.proxy", frontend, ctx.settings.side_concurrency)
    finally:
        p.close()


async def gateway(ctx: Context) -> None:
    """The gateway in front of echo workers vs a bare aiohttp handler answering the same bytes."""
    s = ctx.settings
    p = Procs()
    body_file = Path(tempfile.mkdtemp(prefix="zbatch-bench-")) / "body.json"
    try:
        procs.log(f"gateway: broker, {ECHO_WORKERS} echo workers (384-float outputs), gateway")
        frontend, backend = await procs.start_broker(p)
        await procs.start_echo_workers(p, frontend, backend, ECHO_WORKERS, "--outputs", "vector")
        url = f"{await procs.start_gateway(p, frontend)}/models/{MODEL}"
        async with aiohttp.ClientSession() as session, session.post(url, json={"inputs": "hello"}) as response:
            body_file.write_bytes(await response.read())
            if response.status != 200:
                raise RuntimeError(f"the gateway answered {response.status}: {body_file.read_text()[:200]}")
        for c in s.side_concurrency:
            procs.log(f"gateway: zbatch gateway at concurrency {c}")
            async with http_session(limit=c) as session:
                result = await closed_loop(http_call(session, url, shuffled()), c, s.warmup_s, s.duration_s)
            ctx.rows.append(row("gateway", "zbatch gateway + echo", c, result, body_bytes=body_file.stat().st_size))
    finally:
        p.close()
    p = Procs()
    try:
        bare = await procs.start_http_server(p, "scripts.benchmarks.baselines", "bare", "bare",
                                             "--body-file", str(body_file))
        for c in s.side_concurrency:
            procs.log(f"gateway: bare aiohttp at concurrency {c}")
            async with http_session(limit=c) as session:
                result = await closed_loop(http_call(session, f"{bare}/models/{MODEL}", shuffled()), c,
                                           s.warmup_s, s.duration_s)
            ctx.rows.append(row("gateway", "bare aiohttp", c, result))
    finally:
        p.close()


async def scale(ctx: Context) -> None:
    """N simulated workers (5 ms + 0.2 ms/item per batch of <= 32) behind one broker: throughput vs N."""
    s = ctx.settings
    for n in s.scale_workers:
        p = Procs()
        try:
            procs.log(f"scale: broker with {n} simulated worker(s)")
            frontend, backend = await procs.start_broker(p)
            await procs.start_echo_workers(p, frontend, backend, n, *SIM)
            async with AsyncClient(frontend) as client:
                result = await closed_loop(zmq_raw_call(client, MODEL, shuffled()), s.scale_concurrency,
                                           s.warmup_s, s.duration_s)
            ideal = n * 32 / (5 + 0.2 * 32) * 1000
            ctx.rows.append(row("scale", f"{n} simulated worker{'s' if n > 1 else ''}", s.scale_concurrency,
                                result, workers=n, ideal_req_s=ideal))
        finally:
            p.close()
