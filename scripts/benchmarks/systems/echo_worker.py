"""Fake workers (and libzmq's proxy) that isolate the cost of routing from the cost of the model.

Modes (``python -m scripts.benchmarks.systems.echo_worker MODE ...``):

* ``broker``: speaks the worker side of zbatch/protocol/PROTOCOL.md to a real zbatch
  broker. It answers each REQUEST with REPLY ok at once (payload = the
  request's payload, or with ``--outputs vector`` a fixed 384-float vector per
  input so the gateway can answer as for the real model). With
  ``--batch-ms``, it simulates a model: after each sleep of
  ``batch_ms + item_ms * items`` it takes everything pending, up to
  ``--max-batch`` items, and "runs" it.  ``--count N`` runs N such workers
  in one process, named NAME-0 to NAME-N-1, each on the next broker of a
  comma-separated ``--backend``.
* ``proxy``: ``zmq.proxy`` between a ROUTER frontend and a DEALER backend, the
  libzmq built-in that any broker should be compared with.
* ``forwarder``: the same in Python, on the broker's event loop and socket
  calls but with no logic: the floor for any broker written in Python.
* ``proxy-worker``: a DEALER behind either of these two, turning each REQUEST
  into a protocol REPLY, so the project's AsyncClient works unchanged against all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import deque
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import BatchCounters, Heartbeat, ModelInfo, Ready, Reply, Request, Status
from zbatch.runtime import eventloop, sockets

VECTOR = np.random.default_rng(0).standard_normal(384).astype(np.float32)


class EchoWorker:
    """A worker for the real broker whose 'model' is free (or a fixed, simulated cost)."""

    def __init__(self, args: argparse.Namespace, context: zmq.Context[Any]) -> None:
        self.args = args
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.ROUTING_ID, args.name.encode())
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        self.socket.connect(args.backend)
        self.pending: deque[Request] = deque()
        self.arrived = asyncio.Event()
        self.batches = self.items = 0  # for the heartbeats
        self.busy_s = 0.0  # the simulated batches' time, reported as busy_ms
        self._vectors: dict[int, bytes] = {}

    def ready(self) -> list[bytes]:
        info = ModelInfo(self.args.model, "echo", self.args.max_batch)
        return wire.encode_ready(Ready((info,), self.args.capacity, self.args.name, "", os.getpid(), "echo",
                                       grouped=True))

    def answers(self, requests: list[Request]) -> list[list[bytes]]:
        """The messages that answer ``requests``: those sent grouped in as few as the protocol allows, as the
        real worker answers a batch (PROTOCOL.md 3.10), the others one each."""
        grouped = [self._reply(request) for request in requests if request.grouped]
        alone = [wire.encode_reply(self._reply(request)) for request in requests if not request.grouped]
        return wire.encode_grouped(grouped) + alone

    def _reply(self, request: Request) -> Reply:
        payload = request.payload
        if self.args.outputs == "vector":
            if request.items not in self._vectors:
                self._vectors[request.items] = payloads.encode_payload({"outputs": [VECTOR] * request.items})
            payload = self._vectors[request.items]
        return Reply(request.request_id, Status.OK, "", payload)

    def heartbeat(self) -> list[bytes]:
        counters = BatchCounters(self.batches, self.items, busy_ms=int(self.busy_s * 1000))
        return wire.encode_heartbeat(Heartbeat({self.args.model: counters}))

    def run_instant(self) -> None:
        """Blocking loop, like the proxy's echo worker, so routing is compared like for like."""
        self.socket.send_multipart(self.ready())
        next_beat = time.monotonic()
        while True:
            if time.monotonic() >= next_beat:
                self.socket.send_multipart(self.heartbeat())
                next_beat = time.monotonic() + 1.0
            if not self.socket.poll(max(1, int((next_beat - time.monotonic()) * 1000))):
                continue
            message = wire.decode_broker_to_worker(sockets.recv_frames(self.socket))
            if isinstance(message, Request):
                self.batches += 1
                self.items += message.items
                sockets.send_frames(self.socket, wire.encode_reply(self._reply(message)))
            elif isinstance(message, wire.Disconnect):
                self.socket.send_multipart(self.ready())

    async def run_simulated(self) -> None:
        await self.socket.send_multipart(self.ready())
        self._tasks = [asyncio.create_task(self.heartbeats()), asyncio.create_task(self.simulate())]
        while True:
            message = wire.decode_broker_to_worker(await self.socket.recv_multipart())
            if isinstance(message, Request):
                self.pending.append(message)
                self.arrived.set()
            elif isinstance(message, wire.Disconnect):
                await self.socket.send_multipart(self.ready())

    async def heartbeats(self) -> None:
        while True:
            await self.socket.send_multipart(self.heartbeat())
            await asyncio.sleep(1.0)

    async def simulate(self) -> None:
        """Naive batching: take all that waits (up to the cap), sleep for its 'compute', answer, repeat."""
        while True:
            await self.arrived.wait()
            batch: list[Request] = []
            items = 0
            while self.pending and items + self.pending[0].items <= self.args.max_batch:
                request = self.pending.popleft()
                batch.append(request)
                items += request.items
            if not batch:  # one request larger than the cap runs alone
                batch = [self.pending.popleft()]
                items = batch[0].items
            if not self.pending:
                self.arrived.clear()
            started = time.perf_counter()
            await asyncio.sleep((self.args.batch_ms + self.args.item_ms * items) / 1000)
            self.busy_s += time.perf_counter() - started
            self.batches += 1
            self.items += items
            for frames in self.answers(batch):
                await self.socket.send_multipart(frames)


async def run_simulated_workers(args: argparse.Namespace) -> None:
    """``--count`` simulated workers, spread over the brokers of ``--backend`` in turn."""
    if args.count == 1 and "," not in args.backend:
        await EchoWorker(args, zmq.asyncio.Context()).run_simulated()
        return
    context = zmq.asyncio.Context()
    backends = [backend.strip() for backend in args.backend.split(",") if backend.strip()]
    workers = [EchoWorker(argparse.Namespace(**(vars(args) | {"name": f"{args.name}-{i}",
                                                               "backend": backends[i % len(backends)]})), context)
               for i in range(args.count)]
    await asyncio.gather(*(worker.run_simulated() for worker in workers))


def bound_router_dealer(frontend: str, backend: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A ROUTER for clients and a DEALER for workers, bound, with the broker's high-water marks."""
    context = zmq.Context()
    front, back = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    for sock in (front, back):
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt(zmq.LINGER, 0)
    front.bind(frontend)
    back.bind(backend)
    return front, back


def run_proxy(frontend: str, backend: str) -> None:
    """libzmq's ROUTER<->DEALER proxy: no admission, no credit, no deadlines, round-robin."""
    zmq.proxy(*bound_router_dealer(frontend, backend))


def run_forwarder(frontend: str, backend: str) -> None:
    """The same ROUTER->DEALER forwarding in Python, on the broker's event loop and socket calls, with no logic:
    what any broker written in Python costs before it schedules anything."""
    front, back = bound_router_dealer(frontend, backend)
    route: dict[Any, zmq.Socket[bytes]] = {front: back, back: front}  # keyed by what zmq_poll returns
    inputs = [(front, zmq.POLLIN), (back, zmq.POLLIN)]

    def pump() -> None:
        while ready := zmq.zmq_poll(inputs, 0):
            for sock, _ in ready:
                frames = sockets.recv_frames(sock)
                try:
                    sockets.send_frames(route[sock], frames)
                except zmq.Again:  # no worker connected yet (the readiness probe): dropped; the probe asks again
                    pass

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sock in (front, back):
            loop.add_reader(sock.FD, pump)
        pump()
        await asyncio.Event().wait()

    eventloop.run(serve())


def run_proxy_worker(backend: str) -> None:
    """Answer [client id, REQUEST...] from the proxy with [client id, REPLY...], echoing the payload."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(backend)
    while True:
        sock.poll()
        client, *frames = sockets.recv_frames(sock)
        message = wire.decode_client_message(frames)
        if isinstance(message, Request):
            reply = Reply(message.request_id, Status.OK, "", message.payload)
            sockets.send_frames(sock, [client, *wire.encode_reply(reply)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("broker", "proxy", "forwarder", "proxy-worker"))
    parser.add_argument("--backend", required=True)
    parser.add_argument("--frontend", default="")
    parser.add_argument("--name", default=f"echo-{os.getpid()}")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--batch-ms", type=float, default=0.0)
    parser.add_argument("--item-ms", type=float, default=0.0)
    parser.add_argument("--outputs", choices=("echo", "vector"), default="echo")
    parser.add_argument("--count", type=int, default=1, help="simulated workers in this process (--batch-ms)")
    args = parser.parse_args()
    if args.mode == "proxy":
        run_proxy(args.frontend, args.backend)
    elif args.mode == "forwarder":
        run_forwarder(args.frontend, args.backend)
    elif args.mode == "proxy-worker":
        run_proxy_worker(args.backend)
    elif args.batch_ms > 0:
        eventloop.run(run_simulated_workers(args))
    else:
        EchoWorker(args, zmq.Context()).run_instant()


if __name__ == "__main__":
    main()
