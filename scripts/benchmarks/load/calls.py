"""The calls the load generator makes: one request each, answering with its status, never raising.

HTTP systems go through one aiohttp session; the ZeroMQ path through the
project's own AsyncClient, either as a Python program uses it (``infer``) or
with pre-encoded payloads (``raw``) so routing is measured, not msgpack.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.loops import Call
from zbatch.client import AsyncClient, ZBatchError
from zbatch.protocol import payloads

HTTP_TIMEOUT_S = 60.0


@asynccontextmanager
async def http_session(limit: int) -> AsyncIterator[aiohttp.ClientSession]:
    """One connection pool per run; ``limit`` connections at most (0: no limit)."""
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(HTTP_TIMEOUT_S)) as s:
        yield s


async def saved_answer(url: str, text: str) -> Path:
    """What ``url`` answers for one text, saved to a file (for a bare server to answer the same bytes)."""
    body_file = Path(tempfile.mkdtemp(prefix="zbatch-bench-")) / "body.json"
    async with aiohttp.ClientSession() as session, session.post(url, json={"inputs": text}) as response:
        body_file.write_bytes(await response.read())
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {body_file.read_text()[:200]}")
    return body_file


def gateway_body(text: str) -> Any:
    """One text as the gateway's ``/models/{model}`` takes it (and the baselines, and most peers)."""
    return {"inputs": text}


def _bodies(texts: list[str], body: Callable[[str], Any]) -> Iterator[bytes]:
    return itertools.cycle([json.dumps(body(text)).encode() for text in texts])


def http_call(session: aiohttp.ClientSession, url: str, texts: list[str],
              body: Callable[[str], Any] = gateway_body) -> Call:
    """POST one text as JSON, ``{"inputs": text}`` unless ``body`` shapes it otherwise (a peer's own API);
    status "ok" or the code.  Bodies are encoded once, before the loop."""
    bodies = _bodies(texts, body)
    headers = {"Content-Type": "application/json"}

    async def call() -> str:
        try:
            async with session.post(url, data=next(bodies), headers=headers) as response:
                await response.read()
                return "ok" if response.status == 200 else str(response.status)
        except TimeoutError:
            return "timeout"
        except aiohttp.ClientError as exc:
            return type(exc).__name__

    return call


def zmq_infer_call(client: AsyncClient, model: str, texts: list[str]) -> Call:
    """What a Python program gets from the project's client: numpy outputs, typed errors."""
    cycle = itertools.cycle(texts)

    async def call() -> str:
        try:
            await client.infer(model, [next(cycle)])
            return "ok"
        except ZBatchError as exc:
            return exc.status.value if exc.status is not None else "unavailable"

    return call


def zmq_raw_call(client: AsyncClient, model: str, texts: list[str]) -> Call:
    """Pre-encoded payloads and no decoding, so routing benchmarks measure routing, not msgpack."""
    encoded = itertools.cycle([payloads.encode_payload({"inputs": [t], "parameters": {}}) for t in texts])

    async def call() -> str:
        try:
            reply = await client.request(model, next(encoded), items=1)
        except ZBatchError as exc:
            return exc.status.value if exc.status is not None else "unavailable"
        return reply.status.value

    return call


@asynccontextmanager
async def one_text_calls(path: str, url: str, frontend: str, model: str, concurrency: int, *,
                         tokenize: bool = False) -> AsyncIterator[Call]:
    """One of the bench's texts a request to ``model``: POSTed to the Hugging Face route of the gateway at ``url``
    ("http"), or through ``AsyncClient.infer`` to the brokers at ``frontend`` ("zmq"; ``tokenize``: the client's
    own, its tokenizer fetched first, SystemExit if it cannot be)."""
    if path == "http":
        async with http_session(limit=concurrency) as session:
            yield http_call(session, f"{url}/models/{model}", shuffled())
    else:
        async with AsyncClient(frontend, tokenize=tokenize) as client:
            if tokenize and not await client.prepare_tokenizer(model):
                raise SystemExit(f"the client cannot tokenize for {model}")
            yield zmq_infer_call(client, model, shuffled())
