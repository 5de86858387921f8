"""What aiohttp's own server costs per request at the gateway's rates: the floor under the gateway's CPU.

``python -m scripts.benchmarks.studies.http_floor [--concurrency 32,128] [--seconds 6]`` first measures the
gateway as :mod:`~scripts.benchmarks.studies.cpu_path` does (its stack, one text a request over HTTP, the bench's
aiohttp clients) and then, for each number of clients, four bare aiohttp servers of one process under the same load:

* ``server``: aiohttp's low-level server (``web.Server``), a handler that reads the body and answers fixed bytes;
* ``application``: a ``web.Application`` with one route and as many pass-through middlewares as the gateway runs;
* ``json``: the same application, parsing the body and writing a 384-float vector with orjson, as the gateway does;
* ``relay``: the ``json`` application, sending each body over a ZeroMQ DEALER to a ROUTER in another process that
  answers the vector's float32 bytes, which it writes as JSON: HTTP in, one ZeroMQ round trip, JSON out, as the
  gateway's path is, without its guards, metrics, broker client or msgpack.

Each bare handler waits between reading and answering (a timer, as the gateway's request waits on its reply; the
relay's ROUTER waits before it answers), so that each server answers at about the gateway's rate: aiohttp's cost
per request falls as the rate rises (more requests per wake of the loop).  The wait starts at the gateway's mean
time per request in that cell; a first window shows how far the bare server's own time moved its rate, and the
measured window waits that much less.  Every server runs as the gateway does: on the daemons' event loop, with its
start's garbage frozen, without an access log.  The table prints each server's requests a second and µs of CPU per
request (its own process; not the relay's echo); the gateway's minus the relay's is what the gateway adds to HTTP,
JSON and one ZeroMQ round trip: its guards, metrics and broker client, and msgpack.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import orjson
import zmq
from aiohttp import web

from scripts.benchmarks.common import procs
from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load import calls
from scripts.benchmarks.load import loops as load
from scripts.benchmarks.studies import cpu_path
from scripts.benchmarks.systems.accelerator import MODEL
from zbatch.runtime import eventloop, memory
from zbatch.testing import Daemon, Daemons, free_port, spawn, start_http

SERVERS = ("server", "application", "json", "relay")
GATEWAY_MIDDLEWARES = 5  # connections, request ids, metrics, error shape, the in-flight guard (no API keys)
VECTOR = np.linspace(-1.0, 1.0, cpu_path.DIMENSIONS, dtype=np.float32).reshape(1, -1)

Handler = Callable[[web.BaseRequest], Awaitable[web.Response]]


def handlers_of(kind: str, wait_s: float, echo: str) -> tuple[Handler, Handler]:
    """What a bare server of ``kind`` answers: after the body is read and ``wait_s`` has passed, a vector as JSON;
    and its readiness (the relay's, once its echo answers)."""
    if kind == "relay":
        return relay_to(echo)
    fixed = orjson.dumps(VECTOR, option=orjson.OPT_SERIALIZE_NUMPY)

    async def answer(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        if kind == "json" and not isinstance(orjson.loads(body).get("inputs"), str):
            raise web.HTTPBadRequest()
        await asyncio.sleep(wait_s)
        written = orjson.dumps(VECTOR, option=orjson.OPT_SERIALIZE_NUMPY) if kind == "json" else fixed
        return web.Response(body=written, content_type="application/json")

    return answer, ready


async def ready(request: web.BaseRequest) -> web.Response:
    return web.Response(text="ok")


def relay_to(echo: str) -> tuple[Handler, Handler]:
    """Each request's body to the ROUTER at ``echo``, and its answer's float32 vector back as JSON; ready once a
    round trip comes back."""
    loop = asyncio.get_running_loop()
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(echo)
    waiting: dict[bytes, asyncio.Future[bytes]] = {}
    numbers = iter(range(1 << 62))

    def take_answers() -> None:
        while dealer.poll(0):
            number, answer = dealer.recv_multipart(zmq.NOBLOCK)
            future = waiting.pop(number, None)
            if future is not None and not future.done():  # not one whose request was cancelled meanwhile
                future.set_result(answer)

    loop.add_reader(dealer.fileno(), take_answers)

    async def round_trip(body: bytes) -> bytes:
        number = next(numbers).to_bytes(8, "little")
        waiting[number] = future = loop.create_future()
        dealer.send_multipart([number, body])
        loop.call_soon(take_answers)  # the send may have taken the FD's edge
        reply: bytes = await future
        return reply

    async def answer(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        if not isinstance(orjson.loads(body).get("inputs"), str):
            raise web.HTTPBadRequest()
        vector = np.frombuffer(await round_trip(body), dtype=np.float32).reshape(1, -1)
        return web.Response(body=orjson.dumps(vector, option=orjson.OPT_SERIALIZE_NUMPY),
                            content_type="application/json")

    async def echoed(request: web.BaseRequest) -> web.Response:
        await round_trip(b"")
        return await ready(request)

    return answer, echoed


async def echo(port: int, wait_s: float) -> None:
    """A ROUTER on ``port`` that answers each request with the vector's bytes ``wait_s`` after it came."""
    loop = asyncio.get_running_loop()
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    vector = VECTOR.tobytes()

    def answer(peer: bytes, number: bytes) -> None:
        router.send_multipart([peer, number, vector])
        loop.call_soon(take_requests)  # the send may have taken the FD's edge

    def take_requests() -> None:
        while router.poll(0):
            peer, number, _ = router.recv_multipart(zmq.NOBLOCK)
            loop.call_later(wait_s, answer, peer, number)

    loop.add_reader(router.fileno(), take_requests)
    await asyncio.Event().wait()


def passing() -> Any:
    @web.middleware
    async def pass_on(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        return await handler(request)

    return pass_on


async def serve(kind: str, port: int, wait_s: float, echo_at: str) -> None:
    """One bare server of ``kind`` on ``port`` until killed."""
    if kind == "echo":
        return await echo(port, wait_s)
    handler, health = handlers_of(kind, wait_s, echo_at)
    runner: web.BaseRunner
    if kind == "server":  # every path answers, /healthz too
        runner = web.ServerRunner(web.Server(handler), access_log=None)
    else:
        app = web.Application(middlewares=[passing() for _ in range(GATEWAY_MIDDLEWARES)])
        app.router.add_post("/models/{model}", handler)
        app.router.add_get("/healthz", health)
        runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    memory.collect_off_the_hot_path(logging.getLogger("zbatch.bench"))
    await asyncio.Event().wait()


async def measure_bare(kind: str, concurrency: int, rate: float, warmup_s: float, seconds: float) -> dict[str, Any]:
    """A bare server of ``kind`` at about ``rate`` requests a second: its rate and CPU per request, measured."""
    target_s = concurrency / rate  # the mean time a request at that rate (Little's law)
    first = await window(kind, concurrency, target_s, warmup_s, seconds)
    own_s = concurrency / first["req_s"] - target_s  # what the server and the load generator add to the wait
    return await window(kind, concurrency, max(target_s - own_s, 0.0), warmup_s, seconds)


async def window(kind: str, concurrency: int, wait_s: float, warmup_s: float, seconds: float) -> dict[str, Any]:
    """One closed-loop window against a bare server of ``kind``: its requests a second and CPU per request."""
    async with started(kind, wait_s) as (url, pid), calls.http_session(concurrency) as session:
        call = calls.http_call(session, url, shuffled())
        result = await load.closed_loop(call, concurrency, warmup_s, seconds, watch={kind: pid})
    cpu_us = result.get("cpu_us_per_req", {}).get(kind)
    if result["errors"] or not result["req_s"] or cpu_us is None:
        raise SystemExit(f"the bare {kind} server answered {result['req_s']:.0f} requests a second with "
                         f"{result['errors']} errors, CPU {cpu_us}: its figures would mean nothing")
    return {"req_s": result["req_s"], "cpu_us": cpu_us}


@asynccontextmanager
async def started(kind: str, wait_s: float) -> AsyncIterator[tuple[str, int]]:
    """A bare server of ``kind`` (and the relay's echo) in processes of their own: where to POST, and its pid."""
    with procs.running() as daemons:
        server = await procs.start(daemons, start_bare, kind, wait_s)
        yield f"{server.url}/models/{MODEL}", server.pid


def start_bare(daemons: Daemons, kind: str, wait_s: float) -> Daemon:
    """The relay's echo first (not waited for: the relay's DEALER connects when it binds), then the server, once
    its /healthz answers (the relay's after a round trip through the echo)."""
    echo = ""
    if kind == "relay":
        echo_port = free_port()
        daemons.add(spawn(__spec__.name, "echo", daemons.log_dir, serve="echo", port=echo_port, wait_s=wait_s))
        echo = f"tcp://127.0.0.1:{echo_port}"
    return daemons.add(start_http(__spec__.name, kind, daemons.log_dir, serve=kind, wait_s=wait_s, echo=echo))


def format_table(rows: list[dict[str, Any]]) -> str:
    header = "| clients | gateway req/s · µs | " + " | ".join(f"{kind} req/s · µs" for kind in SERVERS) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        cells = [row["gateway"], *(row[kind] for kind in SERVERS)]
        figures = " | ".join(f"{cell['req_s']:,.0f} · {cell['cpu_us']:,.0f}" for cell in cells)
        lines.append(f"| {row['clients']} | {figures} |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with procs.running() as daemons:
        stack = await procs.start(daemons, cpu_path.start_stack, cpu_path.BATCH_MS, cpu_path.ITEM_MS)
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            procs.log(f"the gateway, {concurrency} clients")
            gateway = await cpu_path.measure("http", stack, concurrency, args.warmup, args.seconds)
            rows.append({"clients": concurrency,
                         "gateway": {"req_s": gateway["req_s"], "cpu_us": gateway["cpu_us"]["gateway"]}})
    for row in rows:
        for kind in SERVERS:
            procs.log(f"{kind}, {row['clients']} clients")
            row[kind] = await measure_bare(kind, row["clients"], row["gateway"]["req_s"], args.warmup, args.seconds)
    print(format_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="32,128", help="comma-separated numbers of closed-loop clients")
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time per cell")
    parser.add_argument("--warmup", type=float, default=cpu_path.WARMUP_S, help="load before each window")
    # A bare server's own process: its kind, port, wait, and for the relay where its echo listens.
    parser.add_argument("--serve", choices=(*SERVERS, "echo"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wait-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--echo", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        eventloop.run(serve(args.serve, args.port, args.wait_s, args.echo))
    else:
        eventloop.run(run(args))


if __name__ == "__main__":
    main()
