"""The worker's pending work: requests in, batches out, one reply per request.

Plain state with an injected clock and no sockets or threads.  Requests are
split into items; a batch takes items in arrival order (a request's items
may span batches) as long as they share the same operation and parameters.
Items of a request that expired, was cancelled or already failed are skipped
when the batch is formed, never sent to the model.  A request is answered
once: when its last item is done, or at its first failure.  Its reply holds
the outputs in input order and, when the runner counted them
(:class:`Counted`), each input's tokens.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from zbatch.protocol import payloads
from zbatch.protocol.vocabulary import OUTPUTS, RUN, TOKENS
from zbatch.protocol.wire import Reply, Status

log = logging.getLogger("zbatch.worker")


@dataclass(slots=True, eq=False)
class PendingRequest:
    job_id: bytes
    inputs: list[Any]
    parameters: dict[str, Any]
    parameters_key: bytes
    deadline: float
    arrived_at: float
    trace: str = ""  # the client's request id, for log lines about this request
    operation: str = RUN
    outputs: list[Any] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)
    next_item: int = 0
    done_items: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class BatchItem:
    request: PendingRequest
    index: int

    @property
    def input(self) -> Any:
        return self.request.inputs[self.index]


@dataclass(frozen=True, slots=True)
class Batch:
    items: tuple[BatchItem, ...]
    parameters: dict[str, Any]
    operation: str = RUN

    @property
    def inputs(self) -> list[Any]:
        return [item.input for item in self.items]


@dataclass(frozen=True, slots=True)
class Counted:
    """One input's output and the tokens the model took for it (the runner counted them)."""

    output: Any
    tokens: int


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """What the model said about one input that could not be processed.

    ``per_input``: the runner refused this input alone (an image it cannot
    decode, a text too long), so the reply names the input's index.
    """

    status: Status
    message: str
    per_input: bool = False


class Assembler:
    def __init__(self) -> None:
        self._queue: deque[PendingRequest] = deque()
        self._by_id: dict[bytes, PendingRequest] = {}
        self.pending_items = 0
        self.skipped_items = {Status.CANCELLED: 0, Status.DEADLINE_EXCEEDED: 0}

    def holds(self, job_id: bytes) -> bool:
        return job_id in self._by_id

    def add(self, request: PendingRequest) -> None:
        request.outputs = [None] * len(request.inputs)
        request.tokens = [None] * len(request.inputs)
        self._queue.append(request)
        self._by_id[request.job_id] = request
        self.pending_items += len(request.inputs)

    def first_arrival(self) -> float:
        """Arrival time of the oldest request that still has items to run."""
        self._skip_finished_head()
        return self._queue[0].arrived_at if self._queue else float("inf")

    def cancel(self, job_id: bytes) -> Reply | None:
        return self.fail(job_id, Status.CANCELLED, "cancelled by the broker")

    def fail(self, job_id: bytes, status: Status, message: str) -> Reply | None:
        """Answer a held request now with ``status``; None if it is not held (or already answered)."""
        request = self._by_id.get(job_id)
        if request is None or request.finished:
            return None
        return self._finish(request, status, message)

    def expire(self, now: float) -> list[Reply]:
        """Answer the requests whose deadline passed before their items could run."""
        expired = [r for r in self._by_id.values() if not r.finished and r.deadline <= now]
        return [self._finish(r, Status.DEADLINE_EXCEEDED, "deadline passed before the model could run it")
                for r in expired]

    def take_batch(self, max_items: int) -> Batch | None:
        """Up to ``max_items`` items in arrival order, all with the same operation and parameters."""
        self._skip_finished_head()
        if not self._queue:
            return None
        head = self._queue[0]
        key, parameters, operation = head.parameters_key, head.parameters, head.operation
        items: list[BatchItem] = []
        for request in self._queue:
            if len(items) == max_items:
                break
            if request.finished or request.next_item == len(request.inputs):
                continue
            if request.parameters_key != key:
                break
            take = min(max_items - len(items), len(request.inputs) - request.next_item)
            items.extend(BatchItem(request, i) for i in range(request.next_item, request.next_item + take))
            request.next_item += take
        self.pending_items -= len(items)
        self._skip_finished_head()
        return Batch(tuple(items), parameters, operation)

    def complete(self, batch: Batch, outcomes: list[Any]) -> list[Reply]:
        """Record one outcome per item (an output, a :class:`Counted` output or an :class:`ItemFailure`);
        return finished replies."""
        replies: list[Reply] = []
        for item, outcome in zip(batch.items, outcomes, strict=True):
            request = item.request
            if request.finished:
                continue
            if isinstance(outcome, ItemFailure):
                message = f"inputs[{item.index}]: {outcome.message}" if outcome.per_input else outcome.message
                replies.append(self._finish(request, outcome.status, message))
                continue
            if isinstance(outcome, Counted):
                outcome, request.tokens[item.index] = outcome.output, outcome.tokens
            request.outputs[item.index] = outcome
            request.done_items += 1
            if request.done_items == len(request.inputs):
                replies.append(self._finish(request, Status.OK, "", _reply_payload(request)))
        return replies

    def _finish(self, request: PendingRequest, status: Status, message: str, payload: bytes = b"") -> Reply:
        """Answer a request once; items it never ran are counted as skipped (cancelled or expired)."""
        if status is not Status.OK:
            # The model failing is worth a warning; a bad input, a late or a cancelled request is not.
            level = {Status.CANCELLED: logging.DEBUG, Status.DEADLINE_EXCEEDED: logging.INFO,
                     Status.BAD_REQUEST: logging.INFO}.get(status, logging.WARNING)
            log.log(level, "job %s answered %s: %s", request.job_id.hex(), status.value, message,
                    extra={"request_id": request.trace})
        request.finished = True
        never_run = len(request.inputs) - request.next_item
        self.pending_items -= never_run
        if status in self.skipped_items:
            self.skipped_items[status] += never_run
        request.next_item = len(request.inputs)
        del self._by_id[request.job_id]
        return Reply(request.job_id, status, message, payload)

    def _skip_finished_head(self) -> None:
        while self._queue and (self._queue[0].finished or self._queue[0].next_item == len(self._queue[0].inputs)):
            self._queue.popleft()

    def __len__(self) -> int:
        return len(self._by_id)


def _reply_payload(request: PendingRequest) -> bytes:
    """``{"outputs": [...]}``, with ``"tokens"`` when the runner counted every input (PROTOCOL.md 5)."""
    body: dict[str, Any] = {OUTPUTS: request.outputs}
    if all(count is not None for count in request.tokens):
        body[TOKENS] = request.tokens
    return payloads.encode_payload(body)
