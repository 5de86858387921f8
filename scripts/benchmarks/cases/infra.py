"""Cases without the model: what the broker and the gateway cost, and how the broker spreads work.

Echo workers answer at once, so whatever latency and throughput remain
belong to the client, the routing layer and (for ``gateway``) HTTP; each
process's CPU per request is recorded too, the figure that does not depend on
how the 2 cores happened to be shared.  ``idle`` puts a model that sleeps
instead of computing behind zbatch and behind a bare aiohttp handler, so the
idle-overhead target has its floor on this host in the same run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from scripts.benchmarks.cases.context import Context, row
from scripts.benchmarks.cases.idle import measure as measure_idle
from scripts.benchmarks.cases.idle import middle, sleeping_systems
from scripts.benchmarks.common import procs
from scripts.benchmarks.common.procs import ECHO_WORKER, MODEL
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import http_call, http_session, saved_answer, zmq_raw_call
from scripts.benchmarks.load.loops import closed_loop
from zbatch.client import AsyncClient, ZBatchError
from zbatch.runtime import native
from zbatch.testing import ROOT, Daemons, endpoint, spawn

ECHO_WORKERS = 2
IDLE_MODEL_MS = 10.0  # the sleeping model of the idle case: about the real model's batch 1 here
GATEWAY_PROCESSES = (1, 2)  # --processes of the gateway rows
IDLE_SYSTEMS = {"http": "zbatch gateway", "bare": "bare aiohttp"}
PYTHON_FLOOR = "Python forwarder, no logic"
COMPILED_BROKER = "zbatch broker, compiled core"  # ZBATCH_NATIVE_DIR: zbatch/runtime/native.py
MAX_BATCH = 32


@dataclass(frozen=True)
class Sim:
    """A simulated model: each batch sleeps ``batch_ms + item_ms * items`` (no CPU used)."""

    label: str
    batch_ms: float
    item_ms: float

    def flags(self) -> tuple[str, ...]:
        return ("--batch-ms", str(self.batch_ms), "--item-ms", str(self.item_ms), "--max-batch", str(MAX_BATCH),
                "--capacity", str(2 * MAX_BATCH))

    def ideal_req_s(self, workers: int) -> float:
        """Full batches back to back on every worker: what the workers allow, whatever the broker costs."""
        return workers * MAX_BATCH / (self.batch_ms + self.item_ms * MAX_BATCH) * 1000


# CPU-class: like all-MiniLM-L6-v2 on this CPU (batch 1: 10-20 ms, batch 32 of ~36-token texts: 240-400 ms).
# GPU-class: a model so cheap that the broker and the Python client on 2 cores become the limit.
CPU_CLASS = Sim("CPU-class", 15.0, 7.0)
SIMS = (CPU_CLASS, Sim("GPU-class", 5.0, 0.2))


async def _zmq_runs(ctx: Context, case: str, system: str, frontend: str, concurrency: tuple[int, ...],
                    daemons: Daemons) -> None:
    s = ctx.settings
    async with AsyncClient(frontend) as client:
        for c in concurrency:
            procs.log(f"{case}: {system} at concurrency {c}")
            result = await closed_loop(zmq_raw_call(client, MODEL, shuffled()), c, s.warmup_s, s.duration_s,
                                       watch=daemons.pids())
            ctx.rows.append(row(case, system, c, result))


def _answers(frontend: str) -> bool:
    """Whether a request through ``frontend`` comes back "ok" (a proxy has no statistics to ask)."""
    async def ask() -> bool:
        async with AsyncClient(frontend, connect_timeout_ms=300) as client:
            reply = await client.request(MODEL, b"\x80", items=1, timeout_ms=300)
            return reply.status.value == "ok"

    try:
        return asyncio.run(ask())
    except ZBatchError:
        return False


def _start_proxy(daemons: Daemons, mode: str, system: str) -> str:
    """libzmq's proxy or the Python forwarder (systems/echo_worker.py ``mode``) and its echo workers; returns its
    frontend."""
    frontend, backend = endpoint(), endpoint()
    daemons.add(spawn(ECHO_WORKER, mode, daemons.log_dir, mode, frontend=frontend, backend=backend))
    for i in range(ECHO_WORKERS):
        daemons.add(spawn(ECHO_WORKER, f"{mode}-echo{i}", daemons.log_dir, "proxy-worker", backend=backend))
    daemons.wait(lambda: _answers(frontend), f"{system} and its echo workers to answer")
    return frontend


async def _compile_native() -> str | None:
    """The folder of scripts/compile-native's build of these sources (scripts/test's, from its cache, where it
    made one); None, with the reason logged, if it cannot build one."""
    done = await asyncio.to_thread(subprocess.run, [str(ROOT / "scripts" / "compile-native")],
                                   env=os.environ | {"ZBATCH_VENV": sys.prefix}, capture_output=True, text=True)
    if done.returncode != 0:
        procs.log(f"routing: no compiled row, scripts/compile-native failed:\n{done.stderr[-2000:]}")
        return None
    build = done.stdout.strip().splitlines()[-1]
    procs.log(f"routing: the broker's hot path compiled with mypyc, in {build} (scripts/compile-native)")
    return build


async def routing(ctx: Context) -> None:
    """The zbatch broker vs libzmq's zmq.proxy, each with 2 instant echo workers and the same client.

    The broker runs twice: interpreted, as installed, and with its hot path compiled by mypyc
    (skipped, with the reason logged, where scripts/compile-native cannot build it).
    A third row, a Python forwarder with no logic at all on the same event loop
    and socket calls as the broker, is the floor for any broker written in
    Python: the share of zmq.proxy that routing costs before any scheduling.
    """
    brokers: list[tuple[str, dict[str, str]]] = [("zbatch broker", {})]
    build = await _compile_native()
    if build is not None:
        brokers.append((COMPILED_BROKER, {native.ENV: build}))
    for system, env in brokers:
        with procs.running() as daemons:
            procs.log(f"routing: {system} with {ECHO_WORKERS} echo workers")
            broker = await procs.start(daemons, procs.start_echo_system, ECHO_WORKERS, env=env)
            await _zmq_runs(ctx, "routing", system, broker.frontend, ctx.settings.side_concurrency, daemons)
    for mode, system in (("proxy", "zmq.proxy"), ("forwarder", PYTHON_FLOOR)):
        with procs.running() as daemons:
            procs.log(f"routing: {system} with {ECHO_WORKERS} echo workers")
            frontend = await procs.start(daemons, _start_proxy, mode, system)
            await _zmq_runs(ctx, "routing", system, frontend, ctx.settings.side_concurrency, daemons)


def _start_echo_gateway(daemons: Daemons, workers: int, processes: int) -> str:
    """Broker, ``workers`` echo workers answering 384-float vectors, and a gateway of ``processes`` processes;
    returns the gateway's URL."""
    broker = procs.start_echo_system(daemons, workers, "--outputs", "vector")
    return procs.start_deployed_gateway(daemons, broker, processes=processes)


def gateway_system(processes: int) -> str:
    """The row name of the gateway with ``processes`` processes (one: the gateway's historical row)."""
    return "zbatch gateway + echo" if processes == 1 else f"zbatch gateway + echo, {processes} processes"


async def gateway(ctx: Context) -> None:
    """The gateway (one process, then two on one port) in front of echo workers vs a bare aiohttp handler
    answering the same bytes."""
    s = ctx.settings
    for processes in GATEWAY_PROCESSES:
        with procs.running() as daemons:
            procs.log(f"gateway: broker, {ECHO_WORKERS} echo workers (384-float outputs), gateway of {processes} "
                      "process(es)")
            url = f"{await procs.start(daemons, _start_echo_gateway, ECHO_WORKERS, processes)}/models/{MODEL}"
            body_file = await saved_answer(url, "hello")
            for c in s.side_concurrency:
                procs.log(f"gateway: {gateway_system(processes)} at concurrency {c}")
                async with http_session(limit=c) as session:
                    result = await closed_loop(http_call(session, url, shuffled()), c, s.warmup_s, s.duration_s,
                                               watch=daemons.pids())
                ctx.rows.append(row("gateway", gateway_system(processes), c, result,
                                    body_bytes=body_file.stat().st_size, processes=processes))
    with procs.running() as daemons:
        bare = await procs.start(daemons, procs.start_http_server, procs.BASELINES, "bare", "bare",
                                 "--body-file", str(body_file))
        for c in s.side_concurrency:
            procs.log(f"gateway: bare aiohttp at concurrency {c}")
            async with http_session(limit=c) as session:
                result = await closed_loop(http_call(session, f"{bare}/models/{MODEL}", shuffled()), c,
                                           s.warmup_s, s.duration_s, watch=daemons.pids())
            ctx.rows.append(row("gateway", "bare aiohttp", c, result))


async def _scale_point(ctx: Context, sim: Sim, workers: int) -> None:
    """One broker, ``workers`` simulated workers, 64 closed-loop clients per worker on one AsyncClient."""
    s = ctx.settings
    clients = s.scale_per_worker * workers
    with procs.running() as daemons:
        procs.log(f"scale: broker with {workers} simulated {sim.label} worker(s), {clients} clients")
        broker = await procs.start(daemons, procs.start_echo_system, workers, *sim.flags())
        async with AsyncClient(broker.frontend) as client:
            result = await closed_loop(zmq_raw_call(client, MODEL, shuffled()), clients, s.warmup_s, s.duration_s)
    name = f"{workers} simulated worker{'s' if workers > 1 else ''}, {sim.label}"
    ctx.rows.append(row("scale", name, clients, result, workers=workers, series=sim.label, batch_ms=sim.batch_ms,
                        item_ms=sim.item_ms, ideal_req_s=sim.ideal_req_s(workers)))


async def scale(ctx: Context) -> None:
    """N simulated workers behind one broker, the same load per worker: throughput vs N, per model class."""
    for sim in SIMS:
        for workers in ctx.settings.scale_workers:
            await _scale_point(ctx, sim, workers)


async def idle(ctx: Context) -> None:
    """Concurrency 1 over HTTP around a model that sleeps (no CPU): zbatch against a bare aiohttp handler."""
    s = ctx.settings
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in IDLE_SYSTEMS}
    procs.log(f"idle: zbatch and a bare aiohttp handler around a model sleeping {IDLE_MODEL_MS:g} ms a call")
    async with sleeping_systems(IDLE_MODEL_MS, tuple(IDLE_SYSTEMS)) as paths:
        for _ in range(s.rounds):
            for path, results in runs.items():
                results.append(await measure_idle(paths[path], s.warmup_s, s.duration_s))
    for path, system in IDLE_SYSTEMS.items():
        ctx.rows.append(row("idle", f"{system}, model sleeping {IDLE_MODEL_MS:g} ms", 1, middle(runs[path]),
                            server=system, sleeping_ms=IDLE_MODEL_MS, rounds=len(runs[path])))
