"""The blocking client: an :class:`~zbatch.client.aio.AsyncClient` on a private event-loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

import zmq.asyncio

from zbatch.client.aio import AsyncClient


class Client:
    """The blocking client: an :class:`AsyncClient` on a private event-loop thread.

    Calls block until their answer; :meth:`submit` returns a
    ``concurrent.futures.Future`` instead, so many requests can be pipelined
    from plain threads.  Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, endpoint: str | Sequence[str] = "tcp://127.0.0.1:5555", **options: Any) -> None:
        """``endpoint``: one broker, or several (comma-separated or a list); ``options`` as :class:`AsyncClient`."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="zbatch-client", daemon=True)
        self._thread.start()
        self._async = self._call(self._make(endpoint, options))

    @staticmethod
    async def _make(endpoint: str | Sequence[str], options: dict[str, Any]) -> AsyncClient:
        return AsyncClient(endpoint, context=zmq.asyncio.Context(), **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, model: str, inputs: list[Any], parameters: dict[str, Any] | None = None,
               **options: Any) -> concurrent.futures.Future[list[Any]]:
        """Send now, answer later: ``.result()`` gives the outputs or raises the typed error."""
        return asyncio.run_coroutine_threadsafe(self._async.infer(model, inputs, parameters, **options), self._loop)

    def infer(self, model: str, inputs: list[Any], parameters: dict[str, Any] | None = None,
              **options: Any) -> list[Any]:
        """Run ``inputs`` through ``model`` and wait; same options as :meth:`AsyncClient.infer`.

        A ``timeout`` (seconds) given to ``.result()`` of :meth:`submit` is the way to
        stop waiting early; cancelling that future cancels the request at the broker.
        """
        return self.submit(model, inputs, parameters, **options).result()

    def stats(self) -> dict[str, Any]:
        """The broker's statistics; with several brokers, their merged view (:meth:`AsyncClient.stats`)."""
        stats: dict[str, Any] = self._call(self._async.stats())
        return stats

    def prepare_tokenizer(self, model: str) -> bool:
        """With ``tokenize``: fetch ``model``'s tokenizer now (:meth:`AsyncClient.prepare_tokenizer`)."""
        return bool(self._call(self._async.prepare_tokenizer(model)))

    def close(self) -> None:
        if self._thread.is_alive():
            context = self._async._context
            self._call(self._async.close())
            context.term()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
