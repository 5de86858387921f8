"""The typed errors a request can end in: one class per protocol status, plus an unreachable broker."""

from __future__ import annotations

from zbatch.protocol.wire import Reply, Status


class ZBatchError(Exception):
    """A request that did not succeed; ``status`` is the protocol status, if the broker gave one."""

    status: Status | None = None

    def __init__(self, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms


class BadRequest(ZBatchError):
    status = Status.BAD_REQUEST


class UnknownModel(ZBatchError):
    status = Status.UNKNOWN_MODEL


class Overloaded(ZBatchError):
    status = Status.OVERLOADED


class NoWorker(ZBatchError):
    status = Status.NO_WORKER


class DeadlineExceeded(ZBatchError):
    status = Status.DEADLINE_EXCEEDED


class WorkerError(ZBatchError):
    status = Status.WORKER_ERROR


class WorkerLost(ZBatchError):
    status = Status.WORKER_LOST


class BrokerUnavailable(ZBatchError):
    """The broker is not connected or did not answer in time."""


ERRORS_BY_STATUS: dict[Status, type[ZBatchError]] = {
    cls.status: cls
    for cls in (BadRequest, UnknownModel, Overloaded, NoWorker, DeadlineExceeded, WorkerError, WorkerLost)
    if cls.status is not None
}


def raise_for_status(reply: Reply) -> None:
    """The typed error of a failed reply; a status with no error class of its own raises :class:`ZBatchError`."""
    if reply.status is Status.OK:
        return
    error = ERRORS_BY_STATUS.get(reply.status)
    if error is None:  # a status no client should see, such as cancelled
        raise ZBatchError(f"the request ended with status {reply.status.value}: {reply.message}")
    raise error(reply.message, reply.retry_after_ms)
