"""The worker's side of the work-conserving invariant (worker/core.py, worker/shares.py), on a fake clock.

    The worker never declines or holds back work it has room for.

Hypothesis drives a worker core of one to three broker links through random sequences: requests of random
sizes and deadlines on any registered link (within what that link's broker was told it may send, and
beyond), batches
that end, cancels, links that register and are lost, and time.  The engine is modelled as the shell runs
it: batches in the order submitted, one at a time, and ``tick`` when a ``WakeAt`` comes.  After every
event the test checks:

* a request is ``declined`` only when the items the worker holds plus its own pass its capacity, and
  never by a worker of one broker;
* every registered link has been told its share as it is now, and the shares told add up to no more than
  the capacity the unregistered links' work leaves;
* the engine never idles while items wait, beyond the batching window: a batch is submitted, or a
  ``WakeAt`` is set no later than ``max_batch_delay`` (or the wait for returning clients, a share of the
  last batch's time) from now.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.worker.test_core import FakeClock, make_core, of, replies, request, slot
from worker.batching import RETURN_SHARE
from worker.core import Action, Submit, WakeAt, WorkerCore
from zbatch.protocol import wire
from zbatch.protocol.wire import Cancel, Heartbeat, Status

BATCH_S = 0.02  # what each batch takes the modelled engine


class Worker(RuleBasedStateMachine):
    core: WorkerCore

    @initialize(links=st.integers(1, 3), capacity=st.integers(1, 10), max_batch=st.integers(1, 6),
                delay_s=st.sampled_from([0.0, 0.005]))
    def start(self, links: int, capacity: int, max_batch: int, delay_s: float) -> None:
        self.clock = FakeClock()
        self.delay_s = delay_s
        self.capacity = capacity
        self.core = make_core(self.clock, slot(max_batch_size=max_batch, delay_s=delay_s), links=links,
                              capacity=capacity)
        self.engine: list[Submit] = []  # submitted, not done: the first runs
        self.wake: float | None = None
        self.jobs = 0
        self.sent: list[tuple[int, bytes]] = []

    def carry_out(self, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, Submit):
                self.engine.append(action)
            elif isinstance(action, WakeAt):
                self.wake = action.when
        return actions

    # ------------------------------------------------------------------ what happens

    def registered_link(self, link: int) -> int | None:
        """The shell hands the core a broker's messages only once that broker took the READY."""
        links = [index for index, each in enumerate(self.core.shares.links) if each.registered]
        return links[link % len(links)] if links else None

    @rule(link=st.integers(0, 2), items=st.integers(1, 12), timeout_ms=st.sampled_from([None, 30, 5_000]))
    def request(self, link: int, items: int, timeout_ms: int | None) -> None:
        registered = self.registered_link(link)
        if registered is None:
            return
        link = registered
        held = self.core.shares.held
        self.jobs += 1
        job = f"j{self.jobs}"
        self.sent.append((link, job.encode()))
        answers = replies(self.carry_out(self.core.message(link, request(job, ["t"] * items, timeout_ms=timeout_ms))))
        declined = [reply for _, reply in answers if reply.status is Status.DECLINED]
        if declined:
            assert self.core.shares.several and held > 0 and held + items > self.capacity, (held, items)

    @precondition(lambda self: bool(self.engine))
    @rule()
    def batch_done(self) -> None:
        done = self.engine.pop(0)
        self.clock.now += BATCH_S
        self.carry_out(self.core.batch_done(done.ticket, ["v"] * len(done.batch.inputs), BATCH_S))

    @rule(seconds=st.sampled_from([0.001, 0.004, 0.02, 0.5]))
    def time_passes(self, seconds: float) -> None:
        """The shell's timer fires when the core asked; its watch ticks now and then too."""
        self.clock.now += seconds
        if self.wake is not None and self.wake <= self.clock.now:
            self.wake = None
            self.carry_out(self.core.tick())

    @rule(index=st.integers(0, 1_000))
    def cancel(self, index: int) -> None:
        if self.sent:
            link, job = self.sent[index % len(self.sent)]
            if self.core.shares.links[link].registered:
                self.carry_out(self.core.message(link, Cancel(job)))

    @rule(link=st.integers(0, 2), registered=st.booleans())
    def link_changes(self, link: int, registered: bool) -> None:
        link %= len(self.core.shares.links)
        self.carry_out(self.core.registered(link) if registered else self.core.lost(link))

    # ------------------------------------------------------------------ what must hold

    @invariant()
    def every_broker_knows_its_share(self) -> None:
        shares = self.core.shares
        kept = sum(link.held for link in shares.links if not link.registered)
        told = [(index, link.announced) for index, link in enumerate(shares.links) if link.registered]
        if shares.several:
            assert all(announced == shares.share(index) for index, announced in told), told
            assert sum(announced or 0 for _, announced in told) <= max(0, self.capacity - kept)
        else:
            assert all(shares.share(index) == self.capacity for index, _ in told)

    @invariant()
    def the_engine_never_idles_while_items_wait(self) -> None:
        if self.engine or not hasattr(self, "core"):
            return
        waiting = sum(s.assembler.pending_items for s in self.core.slots.values())
        if waiting:
            bound = max(self.delay_s, RETURN_SHARE * BATCH_S)
            assert self.wake is not None and self.clock.now < self.wake <= self.clock.now + bound + 1e-9, (
                waiting, self.wake, self.clock.now)


Worker.TestCase.settings = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                                    stateful_step_count=60, suppress_health_check=[HealthCheck.too_slow])
TestWorkConservingWorker = Worker.TestCase


def test_a_share_told_in_a_heartbeat_is_the_share_the_worker_holds_to() -> None:
    """What a broker reads is what the worker keeps: the heartbeat carries the share of :meth:`Shares.share`."""
    core = make_core(FakeClock(), links=2, capacity=5)
    sent = wire.decode_worker_message(core.heartbeat_frames(1))
    assert isinstance(sent, Heartbeat) and sent.capacity == core.shares.share(1) == 2
    assert of(Submit, core.message(1, request("a", ["t"] * 5)))  # more than its share, and the worker was empty
