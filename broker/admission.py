"""Admission: whether the broker takes a request, in the order of PROTOCOL.md section 6.1.

Pure functions of the request, the model's backlog and the limits; the core
calls :func:`refusal` for every REQUEST and answers the refusal it returns.
A refusal that can never turn into an admission (a request larger than the
limit of its priority) is ``bad_request``; one that can, once the backlog
drains, is ``overloaded`` with a hint of when to retry.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.limits import ModelLimits
from broker.state import ModelState
from zbatch.protocol.wire import NORMAL_PRIORITY, Request, Status

RETRY_AFTER_MS = 1_000  # the hint sent with every "overloaded" answer
MAX_MODELS_NAMED = 10  # an "unknown model" answer lists at most this many known models


@dataclass(frozen=True, slots=True)
class Refusal:
    status: Status
    message: str

    @property
    def retry_after_ms(self) -> int | None:
        return RETRY_AFTER_MS if self.status is Status.OVERLOADED else None


def share(limit: int, priority: int, reserve: float) -> int:
    """Normal requests fill ``limit``; low ones are refused a reserved share earlier,
    and high ones may use a reserved share beyond it, so they are refused last."""
    return max(1, int(limit * (1 + reserve * (NORMAL_PRIORITY - priority))))


def too_large(request: Request, limits: ModelLimits, reserve: float) -> Refusal | None:
    """A request that could never be admitted at its priority, however empty the backlog."""
    items = share(limits.max_backlog, request.priority, reserve)
    if request.items > items:
        return Refusal(Status.BAD_REQUEST, f"a request at priority {request.priority} may carry at most {items} "
                                           f"items; this one has {request.items}: split it")
    size = share(limits.max_backlog_bytes, request.priority, reserve)
    if len(request.payload) > size:
        return Refusal(Status.BAD_REQUEST, f"a request at priority {request.priority} may carry at most {size} "
                                           f"payload bytes; this one has {len(request.payload)}: split it")
    return None


def unknown_model(name: str, known: list[str]) -> Refusal:
    named = ", ".join(sorted(known)[:MAX_MODELS_NAMED]) or "none yet"
    more = f" and {len(known) - MAX_MODELS_NAMED} more" if len(known) > MAX_MODELS_NAMED else ""
    return Refusal(Status.UNKNOWN_MODEL, f"no worker serves model {name!r} (models: {named}{more})")


def backlog_full(request: Request, model: ModelState | None, limits: ModelLimits, reserve: float) -> Refusal | None:
    """The model's waiting items, or the payload bytes held for it (waiting or on workers), would pass the
    limits of the request's priority."""
    if model is None:
        return None
    items = share(limits.max_backlog, request.priority, reserve)
    size = share(limits.max_backlog_bytes, request.priority, reserve)
    if model.backlog_items + request.items > items or model.held_bytes + len(request.payload) > size:
        return Refusal(Status.OVERLOADED, f"model {request.model!r} has {model.backlog_items} items waiting and "
                                          f"holds {model.held_bytes} payload bytes; the limit at priority "
                                          f"{request.priority} is {items} items and {size} bytes; retry later")
    return None


def client_saturated(unanswered: int, limit: int) -> Refusal | None:
    """One connection may hold at most ``limit`` unanswered requests."""
    if unanswered < limit:
        return None
    return Refusal(Status.OVERLOADED, f"this connection has {unanswered} requests unanswered, the most the broker "
                                      "holds for one connection; wait for some answers, or open another connection")
