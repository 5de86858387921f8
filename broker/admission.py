"""Admission: whether the broker takes a request, in the order of PROTOCOL.md section 6.1.

Pure functions of the request, the model's state and the limits; the core
calls them for every REQUEST and answers the refusal they return, except
where the invariant of 6.1 overrules them (:meth:`broker.core.BrokerCore._refusal`):
no refusal for load (:func:`memory_full`, :func:`too_slow`) stands while a
worker of the model has credit for the request and nothing of its priority
or higher waits (:meth:`broker.state.ModelState.room_for`), unless the
payload bytes held for the model would pass their bound (:func:`bytes_fit`).

The rule is in units of time.  A request is refused only when the broker
predicts it would not be answered within its own deadline (or within the
model's ``max_queue_ms``, if set)::

    predicted wait = (items ahead of it + its own items) / the model's service rate + lateness
    allowed        = min(its deadline x (1 - deadline_headroom), max_queue_ms if set)

* *Items ahead* are the items on the model's workers and those waiting at
  the request's priority or higher (:meth:`ModelState.ahead_of`): a
  high-priority request waits behind less work.  Low priority may use only
  ``1 - priority_reserve`` of its deadline, so that it is refused first and
  keeps room for the higher classes that overtake it while it waits.
* The *service rate* is the sum of the rates the model's workers measure with
  their batch times (:mod:`broker.rates`).
* *Lateness* is how much later than that the model's answers have come
  lately (:class:`broker.rates.Lateness`): what busy time does not see.
* The *headroom* is the share of its deadline a request is not admitted
  into: a pace that drops after admission (a host whose other processes
  take the cores, a new load's own cost) neither the rate nor the lateness
  can foresee, and without it the requests admitted last answer late.
  Keeping it free costs no throughput: the workers stay busy as long as
  anything waits.
* A refusal is ``overloaded`` with ``retry_after_ms``: how long the items
  ahead take, at that rate, to drain enough for this request to fit.
* A model with nothing ahead admits any request: a wait that is only the
  request's own work is what it asked for, and the prediction is not worth a
  refusal there.  So an ``overloaded`` can always turn into an admission.
* The rate counts only established measurements (:mod:`broker.rates`):
  before any worker has one (a model's first two seconds or so of work, or
  workers that do not report busy time), the estimate is weak and admission
  counts instead: at most ``cold_backlog`` items waiting (at normal
  priority), and a refusal's ``retry_after_ms`` is one heartbeat interval.

Items and payload bytes stay bounded too (``max_backlog``,
``max_backlog_bytes``): those bound the broker's memory, with defaults
meant not to bind before time does.  A request larger than those bounds of
its priority could never be admitted: ``bad_request``.  For the counts, the
priority reserve gives low priority a smaller share and high priority a
larger one (:func:`share`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.limits import ModelLimits
from broker.state import ModelState
from zbatch.protocol.wire import LOW_PRIORITY, MAX_RETRY_AFTER_MS, NORMAL_PRIORITY, Request, Status

RETRY_AFTER_MS = 1_000  # the hint of an "overloaded" that no rate can time: draining, a full connection
MAX_MODELS_NAMED = 10  # an "unknown model" answer lists at most this many known models


@dataclass(frozen=True, slots=True)
class Refusal:
    status: Status
    message: str
    retry_after_ms: int | None = None


def overloaded(message: str, retry_after_ms: int = RETRY_AFTER_MS) -> Refusal:
    return Refusal(Status.OVERLOADED, message, retry_after_ms)


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


def client_saturated(unanswered: int, limit: int) -> Refusal | None:
    """One connection may hold at most ``limit`` unanswered requests."""
    if unanswered < limit:
        return None
    return overloaded(f"this connection has {unanswered} requests unanswered, the most the broker holds for one "
                      "connection; wait for some answers, or open another connection")


def bytes_fit(request: Request, model: ModelState, limits: ModelLimits, reserve: float) -> bool:
    """Whether the payload bytes held for the model (waiting or on workers) stay within the bound of the
    request's priority with its payload: the one bound credit does not keep, since credit counts items."""
    return model.held_bytes + len(request.payload) <= share(limits.max_backlog_bytes, request.priority, reserve)


def memory_full(request: Request, model: ModelState, limits: ModelLimits, reserve: float) -> Refusal | None:
    """The model's waiting items, or the payload bytes held for it (waiting or on workers), would pass the
    bounds of the request's priority."""
    items = share(limits.max_backlog, request.priority, reserve)
    size = share(limits.max_backlog_bytes, request.priority, reserve)
    if model.backlog_items + request.items <= items and bytes_fit(request, model, limits, reserve):
        return None
    excess = max(model.backlog_items + request.items - items, 0)
    retry_ms = RETRY_AFTER_MS if model.rate is None or not excess else retry_after(excess / model.rate)
    return overloaded(f"model {request.model!r} has {model.backlog_items} items waiting and holds "
                      f"{model.held_bytes} payload bytes; the memory bounds at priority {request.priority} are "
                      f"{items} items and {size} bytes; retry later", retry_ms)


def too_slow(request: Request, model: ModelState, timeout_ms: int, limits: ModelLimits, reserve: float,
             headroom: float, now: float, heartbeat_ms: int) -> Refusal | None:
    """The time rule (see the module's docstring); with no established rate yet, the cold count, whose
    refusals hold for one heartbeat interval (``heartbeat_ms``), when the evidence may have grown."""
    ahead = model.ahead_of(request.priority)
    if not ahead:
        return None
    rate = model.rate
    if rate is None:
        cold = share(limits.cold_backlog, request.priority, reserve)
        if model.backlog_items + request.items <= cold:
            return None
        return overloaded(f"model {request.model!r} has {model.backlog_items} items waiting and no established "
                          f"service rate yet; until it has one, the limit at priority {request.priority} is {cold} "
                          "items waiting; retry later", heartbeat_ms)
    wait_s = (ahead + request.items) / rate + model.lateness.now(now)  # ModelState.predicted_wait_s, inlined
    allowed_s = allowed_wait_s(request.priority, timeout_ms, limits, reserve, headroom)
    if wait_s <= allowed_s:
        return None
    queue_binds = 0 < limits.max_queue_ms < timeout_ms * (1 - headroom)
    bound = "the longest wait allowed" if queue_binds else "the share of its deadline a wait may fill"
    return overloaded(f"model {request.model!r} would answer this request in about {wait_s:.2f} s "
                      f"({ahead} items ahead of it at {rate:.0f} items/s), past {bound} ({allowed_s:.2f} s "
                      f"at priority {request.priority}); retry later", retry_after(wait_s - allowed_s))


def allowed_wait_s(priority: int, timeout_ms: int, limits: ModelLimits, reserve: float, headroom: float) -> float:
    """The longest predicted wait a request may be admitted with: its deadline less the headroom, or
    ``max_queue_ms``, whichever is shorter; less the priority reserve for low priority."""
    bound_ms = timeout_ms * (1 - headroom)
    bound_ms = min(bound_ms, limits.max_queue_ms) if limits.max_queue_ms else bound_ms
    return bound_ms / 1000 * (1 - reserve if priority == LOW_PRIORITY else 1)


def retry_after(seconds: float) -> int:
    """A wait as ``retry_after_ms``: rounded up, at least 1 ms, at most the protocol's limit."""
    return min(MAX_RETRY_AFTER_MS, max(1, math.ceil(round(seconds * 1000, 6))))  # 1.1 - 1.0 is 100 ms, not 101
