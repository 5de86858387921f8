"""Talk to a zbatch broker: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both pipeline many requests over one connection and raise the typed errors of
:mod:`zbatch.client.errors` for every status but ``ok``.
"""

from zbatch.client.aio import AsyncClient
from zbatch.client.errors import (
    ERRORS_BY_STATUS,
    BadRequest,
    BrokerUnavailable,
    DeadlineExceeded,
    NoWorker,
    Overloaded,
    UnknownModel,
    WorkerError,
    WorkerLost,
    ZBatchError,
    raise_for_status,
)
from zbatch.client.sync import Client

__all__ = [
    "ERRORS_BY_STATUS", "AsyncClient", "BadRequest", "BrokerUnavailable", "Client", "DeadlineExceeded",
    "NoWorker", "Overloaded", "UnknownModel", "WorkerError", "WorkerLost", "ZBatchError", "raise_for_status",
]
