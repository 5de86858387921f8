"""The worker's scheduling core: messages in, batches and replies out, on an injected clock.

Theory of operation
-------------------
The core is sans-I/O, like the broker's (:mod:`broker.core`).  The shell
(:mod:`worker.server`) feeds it every event with no decision of its own, and
carries out the actions each event returns, in order:

========================================  ==========================================================
event                                     what the core may answer
========================================  ==========================================================
:meth:`~WorkerCore.message` (a broker's)  ``Send`` (a refusal, a share), ``Submit``, ``Prepare``,
                                          ``WakeAt``, ``DrainAcknowledged``
:meth:`~WorkerCore.batch_done`            ``Send`` (the replies), ``Submit`` (the next batch), ``WakeAt``
:meth:`~WorkerCore.tick` (timer, watch)   ``Send`` (expired requests), ``Submit``, ``WakeAt``, ``Stuck``
:meth:`~WorkerCore.registered` / ``lost``  ``Send`` (shares), ``DrainAcknowledged``
:meth:`~WorkerCore.start_drain`           ``Send`` (DRAIN to every broker), ``DrainAcknowledged``
========================================  ==========================================================

and ``Drained`` once a drain is acknowledged and nothing is held.

The rules:

1. **Admission.** A request's payload is decoded within the worker's limits
   (:mod:`worker.requests`) and checked against its model's task; a bad one
   is answered ``bad_request`` at once.  Its deadline is its own timeout, or
   the drain timeout for one that states none.  Several brokers: a request
   that would overfill the worker is declined (:mod:`worker.shares`).
2. **One batch runs, one waits.**  The engine runs batches in order; the
   core hands it at most two: the one running and, while it runs, a full
   batch (it cannot grow any more) queued behind it, so the engine prepares
   it in the running batch's shadow.  Anything else waits in its model's
   :class:`~worker.assembler.Assembler` until the model frees.
3. **Which batch next.**  When the engine is free, every model's batching
   policy (:mod:`worker.batching`) says when its batch is due; the earliest
   due runs, ties to the model whose oldest item waited longest.  A batch due
   later sets a ``WakeAt``.  Expired requests are answered before a batch is
   cut, so an expired item never reaches the model, and at each ``tick``
   while the engine is busy (a scan of everything held: not per message).
4. **Prepare ahead.**  A request that has to wait (its items did not all go
   into a batch at once) of a model the engine prepares ahead for is handed
   out in ``Prepare``, so the engine's pool tokenizes it while it waits.
5. **Replies.**  Each request is answered once, over the broker link it came
   from, under that broker's job id (:class:`~worker.shares.Shares`); the
   answers one event gives to requests their broker sent ``grouped`` leave
   in one REPLIES message per broker (PROTOCOL.md 3.10).
6. **Watchdog.**  A batch running longer than ``batch_timeout_s`` means the
   model is stuck: ``tick`` answers ``Stuck`` and the shell exits.
7. **Drain.**  ``start_drain`` sends DRAIN to every broker; once every
   registered broker acknowledged it (ordered delivery: no request follows),
   the core says ``DrainAcknowledged``, and ``Drained`` once nothing is held.

**The worker's side of work conservation** (PROTOCOL.md 6.1: no request
is refused for load while a worker of its model has free credit for it and
nothing of its priority or higher waits).  The broker's credit is only as
good as the worker's room, so the worker never declines or holds back work
it has room for:

* it declines a REQUEST only when the items it holds plus the request's
  would pass its capacity (a worker of several brokers, whose shares
  changed while the request travelled), and a worker of one broker never
  declines;
* every registered broker has been told its share as it is after each
  event (:meth:`~worker.shares.Shares.changed`), and the shares told add up
  to no more than the capacity the unregistered brokers' work leaves;
* its engine never idles while items wait beyond the batching window: when
  the engine frees, or a request comes to an idle one, a batch is submitted
  at once or a ``WakeAt`` is set no later than ``max_batch_delay`` (or the
  wait for the clients the last batch answered, a share of its time) from
  now.

tests/worker/test_work_conserving.py holds the core to all three through
random sequences of requests, batches, cancels, links and time.

The core owns everything it is given (the slots, the shares and each
request's state); other threads see only the immutable values the actions
carry.
"""

from __future__ import annotations

import logging
import os
import socket as socketlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.assembler import Batch, PendingRequest
from worker.requests import BadPayload, InputLimits, decode_request
from worker.runners.spec import InputError, check_request
from worker.shares import Shares
from worker.slots import ModelSlot, ready_infos
from zbatch.protocol import wire
from zbatch.protocol.vocabulary import RUN
from zbatch.protocol.wire import BrokerToWorkerMessage, Cancel, Drain, Heartbeat, Ready, Reply, Request, Status
from zbatch.runtime.logs import LogLimiter

log = logging.getLogger("zbatch.worker")


# ------------------------------------------------------------------------------------------------ actions

@dataclass(frozen=True, slots=True)
class Send:
    """Send ``frames`` to the broker of link ``link``."""

    link: int
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class Submit:
    """Hand ``batch`` of ``model`` to the engine; it comes back as :meth:`WorkerCore.batch_done` with ``ticket``."""

    ticket: int
    model: str
    batch: Batch


@dataclass(frozen=True, slots=True)
class Prepare:
    """Request ``job_id`` of ``model`` waits for its batch: tokenize its inputs meanwhile (rule 4).

    The shell keeps what it prepares by ``job_id`` while the core holds the request (:meth:`WorkerCore.holds`),
    and hands it to the engine with the request's items (``Submit``); the core never sees it.
    """

    model: str
    job_id: bytes
    inputs: tuple[Any, ...]
    parameters: dict[str, Any]
    parameters_key: bytes


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Call :meth:`WorkerCore.tick` at ``when`` (clock time); None: no timer is needed."""

    when: float | None


@dataclass(frozen=True, slots=True)
class Stuck:
    """A batch has run ``running_s`` seconds, past the batch timeout: the model is stuck (rule 6)."""

    running_s: float


@dataclass(frozen=True, slots=True)
class DrainAcknowledged:
    """Every registered broker acknowledged DRAIN: none will send more."""


@dataclass(frozen=True, slots=True)
class Drained:
    """The drain is acknowledged and nothing is held any more."""


Action = Send | Submit | Prepare | WakeAt | Stuck | DrainAcknowledged | Drained


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """What the core needs of the worker's configuration."""

    capacity: int
    limits: InputLimits
    default_timeout_s: float  # a request that states no timeout: the drain timeout
    batch_timeout_s: float


class WorkerCore:
    """The worker's scheduling state: its models' pending work, the engine's batches, the brokers' shares."""

    def __init__(self, slots: Mapping[str, ModelSlot], links: int, settings: CoreSettings,
                 clock: Callable[[], float], prepare_ahead: frozenset[str] = frozenset()) -> None:
        self.slots = dict(slots)
        self.settings = settings
        self.shares = Shares.of(links, settings.capacity)
        self.clock = clock
        self.logs = LogLimiter(log, clock)
        self.prepare_ahead = prepare_ahead  # models whose waiting requests the engine encodes ahead
        self._in_engine: dict[int, tuple[str, Batch]] = {}  # tickets submitted and not done, oldest first
        self._running_since: float | None = None  # when the engine's oldest batch started
        self._tickets = 0
        self._idle_since = clock()
        self._wake_at: float | None = None
        self._drain_sent = False
        self._drain_acks: set[int] = set()
        self._acknowledged = False
        self._drained = False

    # ---------------------------------------------------------------------------------------- queries

    @property
    def held(self) -> int:
        """Requests held and not answered yet, of every model."""
        return sum(len(slot.assembler) for slot in self.slots.values())

    def holds(self, job_id: bytes) -> bool:
        """Whether request ``job_id`` (its local id) is held and not answered yet."""
        return any(slot.assembler.holds(job_id) for slot in self.slots.values())

    @property
    def running_since(self) -> float | None:
        return self._running_since

    def ready_message(self, link: int, device: str, identity: str) -> Ready:
        """READY with the whole capacity, or (several brokers) this broker's share, at least 1."""
        several = self.shares.several
        capacity = max(1, self.shares.share(link, registering=True)) if several else self.settings.capacity
        return Ready(ready_infos(self.slots.values()), capacity, identity, socketlib.gethostname(), os.getpid(),
                     device, grouped=True)

    def heartbeat_frames(self, link: int) -> list[bytes]:
        counters = {name: slot.counters() for name, slot in self.slots.items()}
        capacity = self.shares.announce(link) if self.shares.several else None
        return wire.encode_heartbeat(Heartbeat(counters, capacity))

    # ----------------------------------------------------------------------------------------- events

    def message(self, link: int, message: BrokerToWorkerMessage) -> list[Action]:
        """One message from the broker of ``link``; whatever goes wrong with it, it is answered."""
        actions: list[Action] = []
        local: bytes | None = None
        try:
            if isinstance(message, Request):
                admitted = self.shares.admit(link, message)
                if isinstance(admitted, Reply):  # declined: full with other brokers' work
                    return [Send(link, wire.encode_reply(admitted))]
                local = admitted.request_id
                self._accept(admitted, actions)
            elif isinstance(message, Cancel):
                local = self.shares.local_id(link, message.request_id)
                self._answer([r for r in (s.assembler.cancel(local) for s in self.slots.values()) if r], actions)
                self._schedule(actions)
            elif isinstance(message, Drain):
                self._drain_acks.add(link)
                self._check_drain(actions)
        except Exception:
            self.logs.log("message-failed", logging.ERROR, "handling a %s from the broker failed; it is answered "
                          "worker_error and the worker goes on", type(message).__name__, exc_info=True)
            if isinstance(message, Request) and local is not None:
                self._fail(local, "the worker failed while taking this request; see its log", actions)
        return actions

    def batch_done(self, ticket: int, outcomes: list[Any], elapsed_s: float) -> list[Action]:
        """The engine finished batch ``ticket``: one outcome per item, in ``elapsed_s`` of model time."""
        now = self.clock()
        self._idle_since = now
        model, batch = self._in_engine.pop(ticket)
        self._running_since = now if self._in_engine else None  # the queued batch starts
        slot = self.slots[model]
        slot.batches += 1
        slot.batched_items += len(batch.items)
        slot.batch_sizes.observe(len(batch.items))
        slot.inference_times.observe(elapsed_s)
        log.debug("%s: batch of %d items in %.1f ms", model, len(batch.items), elapsed_s * 1000)
        replies = slot.assembler.complete(batch, outcomes)
        sizes = {item.request.job_id: len(item.request.inputs) for item in batch.items}
        slot.policy.ran(len(batch.items), elapsed_s, sum(sizes[reply.request_id] for reply in replies), now)
        actions: list[Action] = []
        self._answer(replies, actions)
        self._schedule(actions)
        return actions

    def tick(self) -> list[Action]:
        """A timer the core asked for came, or the shell's watch: run what is due, and check the engine."""
        actions: list[Action] = []
        self._wake_at = None  # the timer asked for has fired, or fires in vain: ask again if still due
        self._expire(actions)
        self._schedule(actions)
        running = self._running_since
        if running is not None and self.clock() - running > self.settings.batch_timeout_s:
            actions.append(Stuck(self.clock() - running))
        return actions

    def registered(self, link: int) -> list[Action]:
        """A broker took the READY: tell it its exact share, and the others theirs if that changed them."""
        self.shares.set_registered(link, True)
        if not self.shares.several:
            return []
        return [Send(link, self.heartbeat_frames(link)), *self._announce_shares()]

    def lost(self, link: int) -> list[Action]:
        """A broker gave this worker up: skip what it sent that has not started, share its capacity out."""
        self.shares.set_registered(link, False)
        actions: list[Action] = []
        orphans = self.shares.orphan(link)
        if orphans:
            log.warning("broker link %d lost: dropping its %d request(s), skipping those not started", link,
                        len(orphans))
            for local in orphans:
                self._answer([r for r in (s.assembler.cancel(local) for s in self.slots.values()) if r], actions)
        actions += self._announce_shares()
        self._check_drain(actions)
        self._schedule(actions)
        return actions

    def start_drain(self) -> list[Action]:
        """Ask every broker to stop sending (rule 7)."""
        self._drain_sent = True
        actions: list[Action] = [Send(link, wire.encode_drain()) for link in range(len(self.shares.links))]
        self._check_drain(actions)
        return actions

    # ---------------------------------------------------------------------------------------- helpers

    def _accept(self, request: Request, actions: list[Action]) -> None:
        now = self.clock()
        slot = self.slots.get(request.model)
        try:
            if slot is None:
                raise BadPayload(f"this worker does not serve model {request.model!r}")
            if self.holds(request.request_id):
                raise BadPayload("this worker already holds a job with that id")
            decoded = decode_request(request.payload, request.items, self.settings.limits)
            check_request(slot.spec.task, decoded.operation, decoded.inputs)
        except (BadPayload, InputError) as exc:
            self.logs.log("refused", logging.INFO, "refused job %s: %s", request.request_id.hex(), exc,
                          request_id=request.trace)
            self._answer([Reply(request.request_id, Status.BAD_REQUEST, str(exc))], actions)
            return
        timeout_s = request.timeout_ms / 1000 if request.timeout_ms else self.settings.default_timeout_s
        if log.isEnabledFor(logging.DEBUG):
            log.debug("accepted job %s for %s: %d item(s)", request.request_id.hex(), request.model, request.items,
                      extra={"request_id": request.trace})
        others_held = len(slot.assembler) > 0
        pending = PendingRequest(request.request_id, decoded.inputs, decoded.parameters, decoded.parameters_key,
                                 now + timeout_s, now, request.trace, decoded.operation)
        slot.assembler.add(pending)
        slot.policy.arrived(now, request.items, others_held)
        self._schedule(actions)
        waits = pending.next_item < len(pending.inputs)
        if waits and pending.operation == RUN and slot.spec.name in self.prepare_ahead:
            actions.append(Prepare(slot.spec.name, pending.job_id, tuple(pending.inputs), pending.parameters,
                                   pending.parameters_key))

    def _schedule(self, actions: list[Action]) -> None:
        """Rules 2 and 3: start the batch that is due, queue a full one behind a running one, or set a timer."""
        now = self.clock()
        if self._in_engine:
            if len(self._in_engine) == 1:
                self._queue_full_batch(actions)
            return
        self._expire(actions)
        due: list[tuple[float, float, ModelSlot]] = []  # (run_at, first arrival, slot)
        for slot in self.slots.values():
            first = slot.assembler.first_arrival()
            run_at = slot.policy.run_at(now, slot.assembler.pending_items, first, self._idle_since)
            if run_at is not None:
                due.append((max(run_at, now), first, slot))
        if not due:
            self._set_wake(None, actions)
            self._check_drained(actions)
            return
        run_at, _, slot = min(due, key=lambda entry: entry[:2])
        if run_at > now:
            self._set_wake(run_at, actions)
            return
        self._set_wake(None, actions)
        batch = slot.assembler.take_batch(slot.max_batch_size)
        if batch is not None:
            self._running_since = now
            self._submit(slot, batch, actions)

    def _expire(self, actions: list[Action]) -> None:
        """Answer the requests whose deadline passed before their items could run."""
        now = self.clock()
        for slot in self.slots.values():
            self._answer(slot.assembler.expire(now), actions)

    def _queue_full_batch(self, actions: list[Action]) -> None:
        full = [slot for slot in self.slots.values() if slot.assembler.pending_items >= slot.max_batch_size]
        if not full:
            return
        slot = min(full, key=lambda each: each.assembler.first_arrival())
        batch = slot.assembler.take_batch(slot.max_batch_size)
        if batch is not None:
            self._submit(slot, batch, actions)

    def _submit(self, slot: ModelSlot, batch: Batch, actions: list[Action]) -> None:
        self._tickets += 1
        self._in_engine[self._tickets] = (slot.spec.name, batch)
        actions.append(Submit(self._tickets, slot.spec.name, batch))

    def _set_wake(self, when: float | None, actions: list[Action]) -> None:
        if when != self._wake_at:
            self._wake_at = when
            actions.append(WakeAt(when))

    def _fail(self, job_id: bytes, message: str, actions: list[Action]) -> None:
        """Answer a request ``worker_error``, once, whether or not it is held already."""
        held = [slot.assembler.fail(job_id, Status.WORKER_ERROR, message) for slot in self.slots.values()]
        replies = [reply for reply in held if reply is not None]
        self._answer(replies or [Reply(job_id, Status.WORKER_ERROR, message)], actions)

    def _answer(self, replies: list[Reply], actions: list[Action]) -> None:
        """Rule 5: each reply over the link its request came from, under that broker's job id."""
        grouped: dict[int, list[Reply]] = {}
        for reply in replies:
            routed = self.shares.route(reply)
            if routed is None:
                continue
            link, answer, together = routed
            if together:
                grouped.setdefault(link, []).append(answer)
            else:
                actions.append(Send(link, wire.encode_reply(answer)))
        for link, answers in grouped.items():
            actions += [Send(link, frames) for frames in wire.encode_grouped(answers)]
        if replies and self.shares.several:
            actions += self._announce_shares()  # a lost broker's work ended: its items go to the others

    def _announce_shares(self) -> list[Action]:
        return [Send(link, self.heartbeat_frames(link)) for link in self.shares.changed()]

    def _check_drain(self, actions: list[Action]) -> None:
        """Rule 7: every registered broker acknowledged DRAIN (none registered: none can send more)."""
        registered = {index for index, link in enumerate(self.shares.links) if link.registered}
        if self._drain_sent and not self._acknowledged and registered <= self._drain_acks:
            self._acknowledged = True
            actions.append(DrainAcknowledged())
            self._schedule(actions)

    def _check_drained(self, actions: list[Action]) -> None:
        if self._acknowledged and not self._drained and not self.held and not self._in_engine:
            self._drained = True
            actions.append(Drained())
