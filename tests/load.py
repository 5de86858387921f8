"""Steady closed-loop HTTP load in a background thread, recording every answer."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True)
class Answer:
    sent_at: float
    latency_s: float
    status: int
    code: str
    retry_after_s: int | None = None  # a 503's Retry-After
    retry: bool = False  # sent again after a 503, once its Retry-After had passed


@dataclass
class Load:
    """``concurrency`` clients posting texts to ``url`` until stopped; every request is accounted for.

    ``enter`` runs first in the load's thread (to move it into a network namespace, say).
    With ``fresh_connections`` each request opens a connection of its own, as a new client would;
    otherwise each client keeps its connection alive.  Each request carries ``texts`` inputs and
    ``headers``; with ``follow_retry_after`` a refused request (503) is sent again once its Retry-After
    has passed (plus up to a tenth more, as jitter), as a client that follows the header does.
    """

    url: str
    concurrency: int = 8
    timeout_s: float = 60.0
    enter: Callable[[], None] | None = None
    fresh_connections: bool = False
    texts: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    follow_retry_after: bool = False
    answers: list[Answer] = field(default_factory=list)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Load:
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 10)
            assert not self._thread.is_alive(), "load generator did not finish: a request hung"

    def successes(self) -> int:
        return sum(1 for a in list(self.answers) if a.status == 200)

    def summary(self) -> dict[str, Any]:
        answers = list(self.answers)
        return {"sent": self.sent, "answered": len(answers), "ok": self.successes(),
                "by_code": dict(Counter(a.code for a in answers))}

    def _main(self) -> None:
        if self.enter is not None:
            self.enter()
        asyncio.run(self._run())

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        # A connection for each client: aiohttp's default pool of 100 would queue the others behind it, their
        # waits counted in their timeout.
        connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=self.fresh_connections)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._client(session, i) for i in range(self.concurrency)))

    async def _client(self, session: aiohttp.ClientSession, number: int) -> None:
        jitter = random.Random(number)
        i, retry = 0, False
        while not self._stop.is_set():
            if not retry:
                i += 1
            texts = [f"client {number} request {i} text {t} " * 3 for t in range(self.texts)]
            inputs: str | list[str] = texts[0] if self.texts == 1 else texts
            self.sent += 1
            started = time.monotonic()
            retry_after: int | None = None
            try:
                async with session.post(self.url, json={"inputs": inputs}, headers=self.headers) as r:
                    body = await r.json()
                    code = "ok" if r.status == 200 else body["error"]["code"]
                    status = r.status
                    if status == 503 and "Retry-After" in r.headers:
                        retry_after = int(r.headers["Retry-After"])
            except (TimeoutError, aiohttp.ClientError) as exc:
                status, code = 0, type(exc).__name__
            self.answers.append(Answer(started, time.monotonic() - started, status, code, retry_after, retry))
            retry = self.follow_retry_after and retry_after is not None
            if retry and retry_after is not None:
                await asyncio.sleep(retry_after * jitter.uniform(1.0, 1.1))
            elif status != 200:
                await asyncio.sleep(0.01)  # a failing stack should not be hammered in a tight loop
