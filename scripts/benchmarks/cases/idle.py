"""Idle overhead at concurrency 1 against how long the model leaves the CPUs idle, on a simulated accelerator.

``python -m scripts.benchmarks.cases.idle [--model-ms 0.01,2,10,20] [--seconds 8] [--rounds 3] [--poll-idle]``
prints a Markdown table: for each model time, the p50 latency of one
closed-loop client over the project's AsyncClient, over HTTP through the
gateway, and against a bare aiohttp handler that sleeps as long in its
handler (the least any HTTP server can add), each with what it adds to the
model's own mean time per call (the middle of the rounds) and how often the
threads of the processes on the path slept per request (each sleep is a
wake-up later).  Broker, worker and gateway are the real ones; only the
model is :class:`scripts.benchmarks.systems.accelerator.SleepRunner`, which sleeps instead
of computing, as a GPU would leave the CPU.  So nothing competes with the
path for a core, and what changes with the model time is only how long the
CPUs sit idle between the hops.

``--poll-idle`` measures each point a second time while holding
``/dev/cpu_dma_latency`` at 0 (root only), which keeps idle CPUs in their
polling state instead of halting them.  In a virtual machine a halted vCPU
exits to the host, and waking it again is slow; the difference between the
two rows is that cost, the share of the idle overhead that waking halted
CPUs accounts for (see BENCHMARKS.md, Analysis); the ``idle`` case of
``scripts/bench`` repeats its 10 ms HTTP points in every run.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import aiohttp

from scripts.benchmarks.common import batches, procs
from scripts.benchmarks.load import calls, loops
from scripts.benchmarks.systems.accelerator import MODEL, start_simulated_worker
from zbatch.client import AsyncClient
from zbatch.runtime import eventloop, wakeup
from zbatch.testing import Daemons, start_broker

TEXTS = ["a short text"]
PATHS = ("zmq", "http", "bare")


@contextmanager
def poll_idle() -> Iterator[None]:
    """Hold every CPU in its polling idle state until the block ends (:func:`zbatch.runtime.wakeup.held`, 0 µs)."""
    with wakeup.held(0, logging.getLogger("zbatch.bench")) as held:
        if not held:
            raise SystemExit(f"--poll-idle needs write access to {wakeup.PM_QOS}: run as root, or leave --poll-idle "
                             "out")
        yield


ModelTime = Callable[[], Awaitable[tuple[float, float]]]  # (model seconds so far, model calls so far)


@dataclass(frozen=True)
class SleepingPath:
    """One way to the sleeping model: its call, the model's clock, and the processes it crosses."""

    call: loops.Call
    model_time: ModelTime
    pids: dict[str, int]


def worker_model_time(metrics: str) -> ModelTime:
    """The worker's time in the model so far, from its Prometheus histogram of batch times."""
    async def read() -> tuple[float, float]:
        taken = await batches.snapshot(metrics)
        return taken.sums.get(f"{batches.TIMES}_sum", 0.0), taken.sums.get(f"{batches.TIMES}_count", 0.0)
    return read


def bare_model_time(url: str) -> ModelTime:
    """The bare server's time asleep in its handler so far, from its /healthz."""
    async def read() -> tuple[float, float]:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/healthz") as response:
            body = await response.json()
        return float(body["model_seconds"]), float(body["calls"])
    return read


async def measure(path: SleepingPath, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """One closed-loop client's run, with ``added_ms``: its p50 minus the model's own mean time per call."""
    seconds_before, calls_before = await path.model_time()
    result = await loops.closed_loop(path.call, 1, warmup_s, duration_s, watch=path.pids)
    seconds_after, calls_after = await path.model_time()
    if calls_after <= calls_before:
        raise RuntimeError(f"the model ran no call while the client sent requests (statuses: "
                           f"{result['all_statuses']}); see the worker and gateway logs")
    model_ms = (seconds_after - seconds_before) / (calls_after - calls_before) * 1000
    return result | {"model_ms": model_ms, "added_ms": result["p50_ms"] - model_ms}


def middle(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose added time is the median (the upper middle of an even count): a real measurement."""
    return sorted(results, key=lambda result: result["added_ms"])[len(results) // 2]


def _start_sleeping_zbatch(daemons: Daemons, model_ms: float) -> tuple[str, str, str]:
    """Broker, the worker around a model sleeping ``model_ms`` a call, and the gateway.

    Returns the broker's frontend, the worker's metrics URL and the gateway's URL.
    """
    broker = daemons.add(start_broker(daemons.log_dir))
    metrics = start_simulated_worker(daemons, broker, model_ms, 0.0)
    return broker.frontend, metrics, procs.start_deployed_gateway(daemons, broker, models=MODEL)


@asynccontextmanager
async def sleeping_systems(model_ms: float, paths: tuple[str, ...] = PATHS
                           ) -> AsyncIterator[dict[str, SleepingPath]]:
    """zbatch (broker, worker, gateway) and a bare aiohttp handler around a model sleeping ``model_ms`` per call.

    Yields each of ``paths``: "zmq" (the AsyncClient), "http" (the gateway) and "bare".
    """
    with procs.running() as daemons:
        frontend, metrics, gateway = await procs.start(daemons, _start_sleeping_zbatch, model_ms)
        url = f"{gateway}/models/{MODEL}"
        body_file = await calls.saved_answer(url, TEXTS[0])
        bare = await procs.start(daemons, procs.start_http_server, procs.BASELINES, "bare", "bare",
                                 "--body-file", str(body_file), "--sleep-ms", str(model_ms))
        pids = daemons.pids()
        zbatch = {name: pids[name] for name in ("broker", "w0")}
        async with (AsyncClient(frontend) as client, calls.http_session(limit=1) as session,
                    calls.http_session(limit=1) as bare_session):
            every = {
                "zmq": SleepingPath(calls.zmq_infer_call(client, MODEL, TEXTS), worker_model_time(metrics), zbatch),
                "http": SleepingPath(calls.http_call(session, url, TEXTS), worker_model_time(metrics),
                                     zbatch | {"gateway": pids["gateway"]}),
                "bare": SleepingPath(calls.http_call(bare_session, f"{bare}/models/{MODEL}", TEXTS),
                                     bare_model_time(bare), {"bare": pids["bare"]}),
            }
            yield {path: every[path] for path in paths}


async def model_point(model_ms: float, modes: list[str], seconds: float, rounds: int) -> dict[str, dict[str, Any]]:
    """The middle round by "mode path" (e.g. "default zmq"), the idle modes alternating within each round."""
    samples: dict[str, list[dict[str, Any]]] = {}
    async with sleeping_systems(model_ms) as paths:
        for _ in range(rounds):
            for mode in modes:
                holding: AbstractContextManager[None] = poll_idle() if mode == "poll" else nullcontext()
                with holding:
                    for path, sleeping in paths.items():
                        result = await measure(sleeping, 1.0, seconds)
                        samples.setdefault(f"{mode} {path}", []).append(result)
    return {key: middle(runs) for key, runs in samples.items()}


def _cell(result: dict[str, Any]) -> str:
    """p50, what it adds to the model, and how often the path's threads slept per request."""
    sleeps = sum((result.get("sleeps_per_req") or {}).values())
    return f"{result['p50_ms']:.2f} ({result['added_ms']:+.2f}; {sleeps:.1f} sleeps)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-ms", default="0.01,2,10,20", help="comma-separated simulated model times per batch")
    parser.add_argument("--seconds", type=float, default=8.0, help="measuring time per point")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per point (the table shows the middle one)")
    parser.add_argument("--poll-idle", action="store_true",
                        help="measure each point again with idle CPUs held in their polling state (root only)")
    args = parser.parse_args()
    modes = ["default", "poll"] if args.poll_idle else ["default"]
    if args.poll_idle:
        with poll_idle():  # fail before starting anything if the hold is not allowed
            pass
    print(f"The model sleeps instead of computing. Idle CPUs: {wakeup.idle_states()}.")
    print("p50 ms of one closed-loop client (in brackets: minus the model's own mean time per call, and how often "
          "the threads of the path's processes, load generator included, slept per request).")
    print("\n| model ms | idle CPUs | zbatch, ZMQ client | zbatch, HTTP | bare aiohttp, model in the handler |\n"
          "|---|---|---|---|---|")
    for model_ms in (float(m) for m in args.model_ms.split(",")):
        point: dict[str, Any] = eventloop.run(model_point(model_ms, modes, args.seconds, args.rounds))
        for mode in modes:
            state = "kernel's choice" if mode == "default" else "polling (cpu_dma_latency 0)"
            cells = " | ".join(_cell(point[f"{mode} {path}"]) for path in PATHS)
            print(f"| {model_ms:g} | {state} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
