"""The worker's scheduling core on a fake clock, with fake messages: every rule of worker/core.py."""

from __future__ import annotations

from typing import Any

import pytest

from worker.assembler import ItemFailure
from worker.batching import BatchPolicy
from worker.core import (
    Action,
    CoreSettings,
    DrainAcknowledged,
    Drained,
    Prepare,
    Send,
    Stuck,
    Submit,
    WakeAt,
    WorkerCore,
)
from worker.requests import InputLimits
from worker.runners import ModelSpec
from worker.slots import ModelSlot
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Cancel, Drain, Reply, Request, Status


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def slot(name: str = "m", max_batch_size: int = 4, delay_s: float = 0.0, task: str = "embeddings") -> ModelSlot:
    return ModelSlot(ModelSpec(name, "/models/" + name, task), max_batch_size, BatchPolicy(max_batch_size, delay_s))


def make_core(clock: FakeClock, *slots: ModelSlot, links: int = 1, capacity: int = 8,
              prepare_ahead: frozenset[str] = frozenset()) -> WorkerCore:
    settings = CoreSettings(capacity, InputLimits(), default_timeout_s=10.0, batch_timeout_s=60.0)
    core = WorkerCore({s.spec.name: s for s in slots or (slot(),)}, links, settings, clock, prepare_ahead)
    for link in range(links):
        core.registered(link)
    return core


def request(job: str, texts: list[Any], model: str = "m", timeout_ms: int | None = None,
            parameters: dict[str, Any] | None = None, operation: str | None = None) -> Request:
    body: dict[str, Any] = {"inputs": texts}
    if parameters is not None:
        body["parameters"] = parameters
    if operation is not None:
        body["operation"] = operation
    return Request(job.encode(), model, len(texts), payloads.encode_payload(body), timeout_ms)


def of(kind: type[Any], actions: list[Action]) -> list[Any]:
    return [action for action in actions if isinstance(action, kind)]


def replies(actions: list[Action]) -> list[tuple[int, Reply]]:
    """The REPLY messages among ``actions``, with their links (a worker sends heartbeats too)."""
    sent = []
    for action in of(Send, actions):
        decoded = wire.decode_worker_message(action.frames)
        if isinstance(decoded, Reply):
            sent.append((action.link, decoded))
    return sent


def outputs(reply: Reply) -> list[Any]:
    body = payloads.decode_payload(reply.payload)
    assert isinstance(body, dict)
    return list(body["outputs"])


def test_a_request_on_an_idle_model_runs_at_once_and_is_answered_once_its_batch_is_done() -> None:
    clock = FakeClock()
    core = make_core(clock)
    (submit,) = of(Submit, core.message(0, request("a", ["x", "y"])))
    assert submit.model == "m" and submit.batch.inputs == ["x", "y"]
    assert core.running_since == clock.now and core.held == 1
    clock.now += 0.01
    (answer,) = replies(core.batch_done(submit.ticket, ["vx", "vy"], 0.01))
    assert answer[0] == 0 and answer[1].request_id == b"a" and answer[1].status is Status.OK
    assert outputs(answer[1]) == ["vx", "vy"]
    assert core.held == 0 and core.running_since is None
    assert (core.slots["m"].batches, core.slots["m"].batched_items) == (1, 2)


@pytest.mark.parametrize(("message", "complaint"), [
    (request("a", ["x"], model="other"), "does not serve model 'other'"),
    (Request(b"a", "m", 1, b"\xc1"), ""),
    (request("a", [3]), "inputs[0] is int"),
    (request("a", ["x"], parameters={"n": 1}, operation="transmogrify"), "operation"),
])
def test_a_bad_request_is_refused_at_once_and_never_batched(message: Request, complaint: str) -> None:
    core = make_core(FakeClock())
    actions = core.message(0, message)
    assert of(Submit, actions) == []
    ((_, answer),) = replies(actions)
    assert answer.status is Status.BAD_REQUEST and complaint in answer.message
    assert core.held == 0


def test_a_job_id_held_already_is_refused_and_the_first_keeps_its_place() -> None:
    core = make_core(FakeClock())
    core.message(0, request("a", ["x"]))
    ((_, answer),) = replies(core.message(0, request("a", ["y"])))
    assert answer.status is Status.BAD_REQUEST and "already holds" in answer.message
    assert core.held == 1


def test_while_one_batch_runs_only_a_full_one_is_queued_behind_it() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=2))
    (first,) = of(Submit, core.message(0, request("a", ["x"])))
    assert of(Submit, core.message(0, request("b", ["y"]))) == []  # could still grow: it waits
    (queued,) = of(Submit, core.message(0, request("c", ["z"])))  # now two items: full
    assert queued.batch.inputs == ["y", "z"]
    assert of(Submit, core.message(0, request("d", ["w"]))) == []  # the engine holds two batches already
    clock.now += 0.01
    done = core.batch_done(first.ticket, ["vx"], 0.01)
    assert of(Submit, done) == [] and core.running_since == clock.now  # the queued batch runs now
    (last,) = of(Submit, core.batch_done(queued.ticket, ["vy", "vz"], 0.01))
    assert last.batch.inputs == ["w"]


def test_a_request_that_waits_is_prepared_ahead_for_models_the_engine_prepares() -> None:
    core = make_core(FakeClock(), slot("m"), slot("n"), prepare_ahead=frozenset({"m"}))
    assert of(Prepare, core.message(0, request("a", ["x"]))) == []  # ran at once: nothing to prepare
    (prepare,) = of(Prepare, core.message(0, request("b", ["y", "z"])))
    assert (prepare.model, prepare.job_id, prepare.inputs) == ("m", b"b", ("y", "z"))
    assert of(Prepare, core.message(0, request("c", ["y"], model="n"))) == []  # not prepared ahead
    assert of(Prepare, core.message(0, request("d", ["y"], operation="tokenize"))) == []  # the tokenizer alone
    assert core.holds(b"b") and not core.holds(b"e")  # the shell keeps what it prepared while the core holds it
    core.message(0, Cancel(b"b"))
    assert not core.holds(b"b")


def test_a_batch_that_waits_for_more_sets_a_timer_and_runs_when_it_fires() -> None:
    clock = FakeClock()
    model = slot(max_batch_size=8, delay_s=0.005)
    core = make_core(clock, model)
    for _ in range(200):  # concurrent arrivals (200/s) teach the policy that more items come
        model.policy.arrived(clock.now, 1, True)
    actions = core.message(0, request("a", ["x"]))
    assert of(Submit, actions) == []
    (wake,) = of(WakeAt, actions)
    assert wake.when == pytest.approx(clock.now + 0.005)
    clock.now = wake.when
    (submit,) = of(Submit, core.tick())
    assert submit.batch.inputs == ["x"]


def test_an_expired_request_is_answered_and_never_reaches_the_model() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=2))
    (running,) = of(Submit, core.message(0, request("a", ["x"])))
    core.message(0, request("late", ["y"], timeout_ms=100))
    clock.now += 0.2
    actions = core.batch_done(running.ticket, ["vx"], 0.2)
    answered = {reply.request_id: reply.status for _, reply in replies(actions)}
    assert answered == {b"a": Status.OK, b"late": Status.DEADLINE_EXCEEDED}
    assert of(Submit, actions) == []
    assert core.slots["m"].counters().expired == 1


def test_a_request_without_a_timeout_gets_the_default_deadline() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=2))
    core.message(0, request("a", ["x"], timeout_ms=60_000))
    core.message(0, request("b", ["y"]))  # waits behind a
    clock.now += 9.9
    assert replies(core.tick()) == []
    clock.now += 0.2
    ((_, answer),) = replies(core.tick())
    assert answer.request_id == b"b" and answer.status is Status.DEADLINE_EXCEEDED


def test_a_cancelled_request_is_skipped_and_answered_cancelled() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=2))
    (running,) = of(Submit, core.message(0, request("a", ["x"])))
    core.message(0, request("b", ["y"]))
    ((_, answer),) = replies(core.message(0, Cancel(b"b")))
    assert answer.status is Status.CANCELLED
    done = core.batch_done(running.ticket, ["vx"], 0.01)
    assert of(Submit, done) == [] and core.slots["m"].counters().cancelled == 1


def test_an_item_that_fails_fails_its_request_alone() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=1))
    (first,) = of(Submit, core.message(0, request("a", ["x", "y"])))
    core.message(0, request("b", ["z"]))
    failure = ItemFailure(Status.BAD_REQUEST, "too long", per_input=True)
    actions = core.batch_done(first.ticket, [failure], 0.01)
    ((_, answer),) = replies(actions)
    assert answer.request_id == b"a" and answer.status is Status.BAD_REQUEST
    assert answer.message == "inputs[0]: too long"
    (after,) = of(Submit, actions)
    assert after.batch.inputs == ["z"]  # a's other item never runs


def test_the_earliest_due_model_runs_first_ties_to_the_longest_waiting() -> None:
    clock = FakeClock()
    core = make_core(clock, slot("m", max_batch_size=2), slot("n", max_batch_size=2))
    (running,) = of(Submit, core.message(0, request("a", ["x"], model="m")))
    core.message(0, request("b", ["y"], model="n"))
    clock.now += 0.001
    core.message(0, request("c", ["z"], model="m"))
    (after,) = of(Submit, core.batch_done(running.ticket, ["vx"], 0.01))
    assert after.model == "n"  # b waited longer than c


def test_a_batch_past_the_timeout_is_stuck() -> None:
    clock = FakeClock()
    core = make_core(clock)
    core.message(0, request("a", ["x"]))
    clock.now += 59
    assert of(Stuck, core.tick()) == []
    clock.now += 2
    (stuck,) = of(Stuck, core.tick())
    assert stuck.running_s == pytest.approx(61)


def test_a_drain_is_acknowledged_once_every_registered_broker_acknowledged_and_drained_once_empty() -> None:
    clock = FakeClock()
    core = make_core(clock, links=2)
    (submit,) = of(Submit, core.message(0, request("a", ["x"])))
    actions = core.start_drain()
    assert sorted(action.link for action in of(Send, actions)) == [0, 1]
    assert [wire.decode_worker_message(a.frames) for a in of(Send, actions)] == [Drain(), Drain()]
    assert of(DrainAcknowledged, actions) == []
    assert of(DrainAcknowledged, core.message(0, Drain())) == []
    assert of(DrainAcknowledged, core.message(1, Drain())) == [DrainAcknowledged()]
    done = core.batch_done(submit.ticket, ["vx"], 0.01)
    assert of(Drained, done) == [Drained()] and len(replies(done)) == 1


def test_a_drain_with_no_broker_registered_is_acknowledged_and_drained_at_once() -> None:
    core = make_core(FakeClock())
    core.lost(0)
    actions = core.start_drain()
    assert of(DrainAcknowledged, actions) == [DrainAcknowledged()] and of(Drained, actions) == [Drained()]


def test_several_brokers_replies_go_over_their_link_and_a_full_worker_declines() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=4), links=2, capacity=2)
    (submit,) = of(Submit, core.message(1, request("same", ["x", "y"])))
    ((link, declined),) = replies(core.message(0, request("more", ["z"])))
    assert link == 0 and declined.status is Status.DECLINED
    answered = replies(core.batch_done(submit.ticket, ["vx", "vy"], 0.01))
    assert [(link, reply.request_id, reply.status) for link, reply in answered] == [(1, b"same", Status.OK)]


def test_a_lost_broker_s_waiting_work_is_dropped_unanswered() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=1), links=2)
    (running,) = of(Submit, core.message(0, request("a", ["x"])))
    core.message(1, request("b", ["y"]))
    actions = core.lost(1)
    assert replies(actions) == []  # that broker gave it up: nobody to answer
    assert core.held == 1
    assert of(Submit, core.batch_done(running.ticket, ["vx"], 0.01)) == []


def grouped(job: str, texts: list[Any]) -> Request:
    plain = request(job, texts)
    return Request(plain.request_id, plain.model, plain.items, plain.payload, grouped=True)


def test_a_batch_s_answers_to_grouped_requests_leave_in_one_message_per_broker() -> None:
    clock = FakeClock()
    core = make_core(clock, slot(max_batch_size=8), links=2)
    (first,) = of(Submit, core.message(0, request("z", ["x"])))  # the engine busy: what comes next waits
    for link, job in ((0, "a"), (1, "b"), (0, "c"), (1, "d")):
        core.message(link, grouped(job, ["x"]))
    core.message(0, request("e", ["x"]))  # this broker did not ask for grouping on it
    (submit,) = of(Submit, core.batch_done(first.ticket, ["v"], 0.01))
    assert len(submit.batch.items) == 5
    sent = [action for action in of(Send, core.batch_done(submit.ticket, ["v"] * 5, 0.01))
            if wire.decode_header(action.frames) is not wire.Command.HEARTBEAT]
    by_link: dict[int, list[list[bytes]]] = {}
    for action in sent:
        by_link.setdefault(action.link, []).append(action.frames)
    assert sorted(by_link) == [0, 1]
    (plain,) = [frames for frames in by_link[0] if frames[0] == wire.HEADERS[wire.Command.REPLY]]
    assert wire.decode_reply(plain).request_id == b"e"
    for link, jobs in ((0, [b"a", b"c"]), (1, [b"b", b"d"])):
        (group,) = [frames for frames in by_link[link] if frames[0] == wire.HEADERS[wire.Command.REPLIES]]
        message = wire.decode_worker_message(group)
        assert isinstance(message, wire.GroupedReplies)
        assert [reply.request_id for reply in message.replies] == jobs
        assert all(outputs(reply) == ["v"] for reply in message.replies)
    assert core.ready_message(0, "cpu", "w").grouped  # what lets its brokers send it grouped requests
