"""What people write instead of zbatch: the Hugging Face "pipelines for a webserver" guide, twice.

* ``naive``: the guide as written: one queue, and a loop in the event loop
  that calls the model on one string at a time (so the model blocks the loop).
* ``batched``: the guide's dynamic batching done right: one 5 ms deadline set
  by the first item's arrival (never restarted), at most 32 items, the model in
  its own thread, and 503 once 256 requests are queued.
* ``bare``: no model at all; returns fixed bytes, to price the HTTP layer alone.
  With ``--sleep-ms`` its handler first sleeps that long, as the naive server
  calls its model: the least any HTTP server can add to a model's time
  (``python -m scripts.benchmarks.cases.idle``).

All speak the gateway's ``POST /models/{model}`` ``{"inputs": "text"}`` shape.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import time
from typing import Any

from aiohttp import web

from scripts.benchmarks.systems.model import load

QUEUE = web.AppKey("queue", asyncio.Queue)
BATCHED = web.AppKey("batched", bool)
MAX_BATCH, MAX_DELAY_S, MAX_QUEUED = 32, 0.005, 256


async def naive_loop(queue: asyncio.Queue[Any], runner: Any) -> None:
    while True:
        text, future = await queue.get()
        future.set_result(runner.run([text], {})[0])  # blocks the event loop, as in the guide


async def batched_loop(queue: asyncio.Queue[Any], runner: Any, pool: concurrent.futures.Executor) -> None:
    loop = asyncio.get_running_loop()
    while True:
        batch = [await queue.get()]
        deadline = batch[0][2] + MAX_DELAY_S  # fixed by the first item's arrival
        while len(batch) < MAX_BATCH:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        try:
            outputs = await loop.run_in_executor(pool, runner.run, [text for text, _, _ in batch], {})
        except Exception as exc:
            outputs = [exc] * len(batch)
        for (_, future, _), output in zip(batch, outputs, strict=True):
            if not future.done():
                (future.set_exception if isinstance(output, Exception) else future.set_result)(output)


async def embed(request: web.Request) -> web.Response:
    queue = request.app[QUEUE]
    if queue.qsize() >= MAX_QUEUED:
        return web.json_response({"error": "overloaded"}, status=503, headers={"Retry-After": "1"})
    text = (await request.json())["inputs"]
    future = asyncio.get_running_loop().create_future()
    await queue.put((text, future, time.monotonic()) if request.app[BATCHED] else (text, future))
    return web.json_response((await future).tolist())


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def model_app(batched: bool, threads: int) -> web.Application:
    app = web.Application()
    app[BATCHED] = batched
    app.add_routes([web.post("/models/{model}", embed), web.get("/healthz", health)])

    async def lifecycle(app: web.Application) -> Any:
        app[QUEUE] = asyncio.Queue()
        if batched:  # the model lives in one thread: load it there, and only ever call it there
            pool = concurrent.futures.ThreadPoolExecutor(1)
            runner = await asyncio.get_running_loop().run_in_executor(pool, load, threads)
            task = asyncio.create_task(batched_loop(app[QUEUE], runner, pool))
        else:
            task = asyncio.create_task(naive_loop(app[QUEUE], load(threads)))
        yield
        task.cancel()

    app.cleanup_ctx.append(lifecycle)
    return app


def bare_app(body: bytes, sleep_s: float = 0.0) -> web.Application:
    """Answers ``body``; with ``sleep_s``, after sleeping in the handler (its /healthz sums the sleeps)."""
    slept = {"calls": 0, "model_seconds": 0.0}

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        started = time.perf_counter()
        if sleep_s:
            time.sleep(sleep_s)
        slept["calls"] += 1
        slept["model_seconds"] += time.perf_counter() - started
        return web.Response(body=body, content_type="application/json")

    async def bare_health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"} | slept)

    app = web.Application()
    app.add_routes([web.post("/models/{model}", answer), web.get("/healthz", bare_health)])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("naive", "batched", "bare"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--body-file", default="", help="bare: the bytes to answer with")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="bare: sleep this long in the handler first")
    args = parser.parse_args()
    if args.mode == "bare":
        with open(args.body_file, "rb") as f:
            app = bare_app(f.read(), args.sleep_ms / 1000)
    else:
        app = model_app(args.mode == "batched", args.threads)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
