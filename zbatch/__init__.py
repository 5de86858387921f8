"""zbatch: the library that the broker, the workers, the gateway and every user share.

Rooms
-----
* :mod:`zbatch.protocol`: the wire protocol (``PROTOCOL.md`` is its normative
  text), its message codec and the payload codec.  Sans-I/O: no sockets.
* :mod:`zbatch.client`: :class:`Client` and :class:`AsyncClient`, the typed
  errors they raise, and the overload breaker.  This is what users import.
* :mod:`zbatch.runtime`: what every daemon runs on: settings (flags, env,
  TOML), logging, sd_notify, the event loop, histograms, the metrics page,
  CURVE, the ZeroMQ socket helpers and the one daemon skeleton.
* :mod:`zbatch.tools`: the small commands ``zbatch-status`` and ``zbatch-keys``.
* :mod:`zbatch.supervisor`: ``zbatch serve``, which runs and restarts a whole
  stack, and the supervision the gateway's ``--processes`` uses too; the
  ``zbatch`` command (:mod:`zbatch.cli`) runs it and the tools.
* :mod:`zbatch.testing`: real daemons on free ports, always stopped: the
  harness of the tests and the benchmarks, and of your own integration tests.

Rules
-----
1. ``broker/``, ``worker/`` and ``gateway/`` each import ``zbatch`` and never
   one another.  Anything two daemons need lives here.
   (``tests/test_layout.py`` walks the imports and fails on a crossing.)
2. Nothing in ``zbatch`` imports a daemon package.
3. The sans-I/O parts (the protocol here, the supervisor's restart policy,
   the broker's core, the worker's batching policy) import neither ``zmq`` nor ``asyncio``: they take a clock
   and return decisions, and the caller does the I/O.
4. Importing ``zbatch`` itself is cheap: ``Client`` and ``AsyncClient`` are
   loaded on first use, so the broker core can import the protocol without
   pulling in ZeroMQ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zbatch.client import (
        AsyncClient,
        BadRequest,
        BrokerUnavailable,
        Client,
        DeadlineExceeded,
        NoWorker,
        Overloaded,
        UnknownModel,
        WorkerError,
        WorkerLost,
        ZBatchError,
    )

__all__ = [
    "AsyncClient", "BadRequest", "BrokerUnavailable", "Client", "DeadlineExceeded", "NoWorker",
    "Overloaded", "UnknownModel", "WorkerError", "WorkerLost", "ZBatchError",
]


def __getattr__(name: str) -> Any:
    """``from zbatch import Client``: the client (and ZeroMQ) load only when asked for."""
    if name in __all__:
        from zbatch import client

        return getattr(client, name)
    raise AttributeError(f"module 'zbatch' has no attribute {name!r}")
