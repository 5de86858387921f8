"""Closed-loop load from several processes, for rates one Python process cannot drive (a GPU stack's).

``spread_closed_loop`` starts ``processes`` children (``python -m scripts.benchmarks.load.processes ...``), each
running ``concurrency / processes`` closed-loop clients (:mod:`scripts.benchmarks.load.loops`'s request loop)
over HTTP (the gateway's ``/models/{model}``) or ZeroMQ (the project's ``AsyncClient``), ``texts`` texts a
request.  Each child writes what it measured, with every answered request's latency, and the parent merges
them: the rate over the common window, percentiles over all latencies, statuses summed, and the cores the
whole machine used meanwhile (stack and load generator together: they share the host).  The cases that
follow a stack through a transition (:mod:`scripts.benchmarks.cases.transitions`) start the children
themselves (:func:`start_children`): with ``--ready URL`` a child starts its clients the moment URL answers
200, and with ``--records`` its result also holds every request (sent, answered, status), for the parent to
place them against the moments it killed or started something.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scripts.benchmarks.common import cpu
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.loops import Call, Sample, _request
from zbatch.testing import ROOT, daemon_env, http_status, wait_until

DRAIN_S = 30.0  # a child waits this long for requests still in flight after its window
READY_WAIT_S = 300.0  # how long a child with --ready waits for it


async def spread_closed_loop(kind: str, target: str, model: str, concurrency: int, warmup_s: float,
                             duration_s: float, processes: int = 4, texts: int = 1,
                             tokenize: bool = False) -> dict[str, Any]:
    """``concurrency`` closed-loop clients spread over ``processes`` children; their answers merged.

    ``tokenize``: ZeroMQ clients tokenize for the workers (``AsyncClient``'s ``tokenize``)."""
    options = ("--tokenize",) if tokenize else ()
    children = await start_children(kind, target, model, concurrency, warmup_s, duration_s, processes, texts,
                                    *options)
    await asyncio.sleep(warmup_s)
    start = cpu.snapshot()
    gpu = await gpu_busy(duration_s)
    machine = cpu.usage(start, cpu.snapshot())
    results = await collect(children)
    cores = machine.get("ours_cores", 0.0) + machine.get("other_cores", 0.0) if machine else None
    return merge(results, texts) | {"processes": len(children), "concurrency": concurrency, "machine_cores": cores,
                                    "gpu_busy_pct": gpu}


@dataclass(frozen=True)
class Child:
    """A load generator's process and the file it writes its result to as it ends."""

    process: asyncio.subprocess.Process
    result: Path


async def start_children(kind: str, target: str, model: str, concurrency: int, warmup_s: float, duration_s: float,
                         processes: int = 4, texts: int = 1, *options: str) -> list[Child]:
    """The children of :func:`spread_closed_loop`, started (``options``: more of their flags, such as
    ``--records`` or ``--ready URL``); :func:`collect` their results.  Each writes its result to a file of its
    own rather than to a pipe: a pipe read by the event loop has been seen to end short (a child that exited 0
    and whose printed result did not parse, in CI)."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (index < concurrency % processes) for index in range(processes)]
    folder = Path(tempfile.mkdtemp(prefix="zbatch-load-"))
    children = []
    for index, share in enumerate(shares):
        result = folder / f"child-{index}.json"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scripts.benchmarks.load.processes", kind, target, "--model", model,
            "--concurrency", str(share), "--warmup", str(warmup_s), "--duration", str(duration_s), "--texts",
            str(texts), "--seed", str(index), "--result", str(result), *options, env=daemon_env(), cwd=ROOT)
        children.append(Child(process, result))
    return children


async def collect(children: list[Child]) -> list[dict[str, Any]]:
    """What each child measured, once all have finished; a child that failed, or left no result that parses,
    is an error that says which and what it left."""
    await asyncio.gather(*(child.process.wait() for child in children))
    results = [_result(index, child) for index, child in enumerate(children)]
    for folder in {child.result.parent for child in children}:
        folder.rmdir()
    return results


def _result(index: int, child: Child) -> dict[str, Any]:
    """One child's result, read from its file."""
    written = child.result.read_bytes() if child.result.exists() else b""
    try:
        if child.process.returncode:
            raise ValueError(f"it exited with status {child.process.returncode}")
        result: dict[str, Any] = json.loads(written)
    except ValueError as exc:
        shown = written[:300] + (b" ... " + written[-300:] if len(written) > 600 else written[300:600])
        raise RuntimeError(f"load generator {index} failed ({exc}); it wrote {len(written)} bytes to "
                           f"{child.result}: {shown!r} (its stderr is above)") from None
    child.result.unlink()
    return result


async def gpu_busy(duration_s: float, every_s: float = 0.5) -> float | None:
    """The GPU's mean utilization over the next ``duration_s`` (nvidia-smi's, sampled); None without one."""
    command = shutil.which("nvidia-smi")
    readings: list[float] = []
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        if command is not None:
            probe = await asyncio.create_subprocess_exec(
                command, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            out, _ = await probe.communicate()
            readings += [float(line) for line in out.decode().split() if line.replace(".", "").isdigit()]
        await asyncio.sleep(max(0.0, min(every_s, end - time.monotonic())))
    return round(sum(readings) / len(readings), 1) if readings else None


def merge(results: list[dict[str, Any]], texts: int) -> dict[str, Any]:
    """One result from the children's: their windows are the same length and nearly the same time."""
    duration = float(np.mean([result["duration_s"] for result in results]))
    latencies = np.asarray([ms for result in results for ms in result["ok_ms"]])
    statuses: Counter[str] = Counter()
    for result in results:
        statuses.update(result["statuses"])
    ok = len(latencies)
    p50, p99 = (float(v) for v in np.percentile(latencies, [50, 99])) if ok else (None, None)
    refused = [ms for result in results for ms in result["refused_ms"]]
    return {"duration_s": duration, "requests": sum(statuses.values()), "ok": ok, "errors": sum(statuses.values()) - ok,
            "req_s": ok / duration, "texts_s": ok * texts / duration, "p50_ms": p50, "p99_ms": p99,
            "refused_p99_ms": float(np.percentile(refused, 99)) if refused else None,
            "statuses": dict(statuses), "abandoned": sum(result["abandoned"] for result in results)}


@asynccontextmanager
async def _caller(kind: str, target: str, model: str, texts: int, seed: int, tokenize: bool = False
                  ) -> AsyncIterator[Call]:
    """One call of ``kind``: POST to the URL ``target`` (http), or infer through the broker frontend ``target``
    (zmq; ``tokenize``: the client tokenizes); ``texts`` of the bench's texts a request, from a per-child offset."""
    inputs = shuffled(seed)
    batches = itertools.cycle([inputs[i:i + texts] for i in range(0, len(inputs) - texts + 1, texts)])
    if kind == "http":
        import aiohttp

        bodies = [json.dumps({"inputs": batch if texts > 1 else batch[0]}).encode() for batch in
                  itertools.islice(batches, 64)]
        cycle = itertools.cycle(bodies)
        url = target
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(60)) as session:
            async def call() -> str:
                try:
                    async with session.post(url, data=next(cycle), headers={"Content-Type": "application/json"}) \
                            as response:
                        await response.read()
                        return "ok" if response.status == 200 else str(response.status)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    return type(exc).__name__

            yield call
        return
    from zbatch.client import AsyncClient, ZBatchError

    async with AsyncClient(target, tokenize=tokenize) as client:
        if tokenize and not await client.prepare_tokenizer(model):
            raise SystemExit(f"the client cannot tokenize for {model}: its workers announce no tokenizer, or it "
                             "could not be fetched")
        async def infer() -> str:
            try:
                await client.infer(model, next(batches))
                return "ok"
            except ZBatchError as exc:
                return exc.status.value if exc.status is not None else "unavailable"

        yield infer


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    samples: list[Sample] = []
    attempts: list[Sample] = []
    async with _caller(args.kind, args.target, args.model, args.texts, args.seed, args.tokenize) as call:
        if args.ready:
            await asyncio.to_thread(wait_until, lambda: http_status(args.ready, 1.0) == 200, READY_WAIT_S,
                                    f"{args.ready} to answer 200")
        t0 = time.perf_counter()
        window = (t0 + args.warmup, t0 + args.warmup + args.duration)

        async def user() -> None:
            while time.perf_counter() < window[1]:
                samples.append(await _request(call, frozenset(), attempts, window[1]))

        tasks = [asyncio.create_task(user()) for _ in range(args.concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=args.warmup + args.duration + DRAIN_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    inside = [s for s in samples if window[0] <= s.end <= window[1]]
    wall = time.time() - time.perf_counter()  # a sample's time.perf_counter() plus this is its time.time()
    return {"duration_s": args.duration, "statuses": dict(Counter(s.status for s in inside)),
            "ok_ms": [round((s.end - s.start) * 1000, 3) for s in inside if s.status == "ok"],
            "refused_ms": [round((s.end - s.start) * 1000, 3) for s in inside if s.status in ("503", "overloaded")],
            "abandoned": len(pending), "started": t0 + wall,
            **({"records": [(round(s.start + wall, 4), round(s.end + wall, 4), s.status) for s in samples]}
               if args.records else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("http", "zmq"))
    parser.add_argument("target", help="the URL to POST {\"inputs\": ...} to (http) or a broker's frontend (zmq)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--texts", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenize", action="store_true", help="zmq: the clients tokenize for the workers")
    parser.add_argument("--ready", default=None, metavar="URL",
                        help="start the clients the moment GET URL answers 200 (a gateway's /readyz)")
    parser.add_argument("--records", action="store_true",
                        help="also record every request in the result: time.time() sent and answered, and its status")
    parser.add_argument("--result", type=Path, default=None, metavar="PATH",
                        help="write the result to PATH (whole, once the run ends) instead of printing it")
    args = parser.parse_args()
    from zbatch.runtime import eventloop

    result = json.dumps(eventloop.run(_child(args)))
    if args.result is None:
        print(result)
    else:
        staged = args.result.with_suffix(".partial")
        staged.write_text(result)
        staged.rename(args.result)


if __name__ == "__main__":
    main()
