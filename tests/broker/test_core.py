"""The broker's scheduling core, driven by fake frames and a fake clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.core import BrokerCore, Peer
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import BatchCounters, Heartbeat, ModelInfo, Ready, Reply, Request, Status

MODEL = "m"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_core(clock: FakeClock, **overrides: Any) -> BrokerCore:
    settings: dict[str, Any] = {"models": (MODEL,), "max_backlog": 8, "timeout_ms": 1000, "no_worker_grace_ms": 500}
    settings |= overrides
    return BrokerCore(BrokerConfig(**settings).core_settings(), clock)


def ready(core: BrokerCore, identity: bytes, capacity: int = 4, model: str = MODEL) -> None:
    core.worker_message(identity, wire.encode_ready(Ready((ModelInfo(model, "embeddings", 2),), capacity)))


def send(core: BrokerCore, request_id: bytes, items: int = 1, client: bytes = b"C", **kw: Any) -> None:
    core.client_message(client, wire.encode_request(Request(request_id, kw.pop("model", MODEL), items, b"P", **kw)))


def take(core: BrokerCore) -> list[tuple[Peer, bytes, list[bytes]]]:
    out, core.outbox = core.outbox, []
    return out


def client_replies(out: list[tuple[Peer, bytes, list[bytes]]]) -> list[Reply]:
    return [wire.decode_reply(frames) for peer, _, frames in out if peer is Peer.CLIENT]


def dispatched(out: list[tuple[Peer, bytes, list[bytes]]]) -> list[tuple[bytes, Request]]:
    result = []
    for peer, identity, frames in out:
        if peer is Peer.WORKER and frames[0] == wire.HEADERS[wire.Command.REQUEST]:
            message = wire.decode_broker_to_worker(frames)
            assert isinstance(message, Request)
            result.append((identity, message))
    return result


def worker_reply(core: BrokerCore, worker: bytes, job_id: bytes, status: Status = Status.OK) -> None:
    core.worker_message(worker, wire.encode_reply(Reply(job_id, status, "", b"result")))


def test_request_is_dispatched_with_payload_untouched_and_reply_forwarded(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r1", items=2)
    [(worker, job)] = dispatched(take(core))
    assert worker == b"W1" and job.payload == b"P" and job.items == 2 and job.timeout_ms == 1000
    worker_reply(core, b"W1", job.request_id)
    [reply] = client_replies(take(core))
    assert reply == Reply(b"r1", Status.OK, "", b"result")


def test_work_spreads_to_the_worker_with_most_free_credit(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=4)
    ready(core, b"W2", capacity=4)
    for i in range(4):
        send(core, b"r%d" % i)
    workers = [w for w, _ in dispatched(take(core))]
    assert sorted(workers) == [b"W1", b"W1", b"W2", b"W2"]


def test_ties_go_to_the_least_recently_used_worker(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    ready(core, b"W2")
    seen = []
    for i in range(4):
        send(core, b"r%d" % i)
        [(worker, job)] = dispatched(take(core))
        clock.advance(0.01)
        worker_reply(core, worker, job.request_id)
        take(core)
        seen.append(worker)
    assert seen == [b"W1", b"W2", b"W1", b"W2"]


def test_backlog_waits_for_credit_in_fifo_order(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=2)
    for i in range(4):
        send(core, b"r%d" % i)
    first = dispatched(take(core))
    assert [job.items for _, job in first] == [1, 1]
    worker_reply(core, b"W1", first[0][1].request_id)
    [(_, next_job)] = dispatched(take(core))
    assert core.stats()["models"][MODEL]["backlog_items"] == 1
    assert next_job.request_id not in {job.request_id for _, job in first}


def test_shedding_counts_items_at_admission(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog=4)
    send(core, b"a", items=3)
    send(core, b"b", items=1)
    assert client_replies(take(core)) == []
    send(core, b"c", items=1)
    [reply] = client_replies(take(core))
    assert reply.status is Status.OVERLOADED and reply.retry_after_ms == 1000
    assert "4 items waiting" in reply.message


def test_request_larger_than_backlog_limit_is_a_bad_request(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog=4)
    send(core, b"a", items=5)
    [reply] = client_replies(take(core))
    assert reply.status is Status.BAD_REQUEST and "split it" in reply.message


def test_deadline_expires_waiting_request_and_it_is_never_dispatched(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    ready(core, b"W1", capacity=1)
    send(core, b"busy")
    [(_, running)] = dispatched(take(core))
    send(core, b"late", timeout_ms=200)
    clock.advance(0.2)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.request_id == b"late" and reply.status is Status.DEADLINE_EXCEEDED
    worker_reply(core, b"W1", running.request_id)
    out = take(core)
    assert dispatched(out) == [] and [r.request_id for r in client_replies(out)] == [b"busy"]


def test_timeout_is_capped_at_the_maximum(clock: FakeClock) -> None:
    core = make_core(clock, max_timeout_ms=2000)
    ready(core, b"W1")
    send(core, b"r", timeout_ms=999_999)
    [(_, job)] = dispatched(take(core))
    assert job.timeout_ms == 2000


def test_in_flight_request_past_its_deadline_is_answered_once(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1", capacity=1)
    send(core, b"r")
    [(_, job)] = dispatched(take(core))
    clock.advance(1.0)
    core.tick()
    assert [r.status for r in client_replies(take(core))] == [Status.DEADLINE_EXCEEDED]
    send(core, b"next")
    assert dispatched(take(core)) == []  # the worker's credit is still taken
    worker_reply(core, b"W1", job.request_id)
    out = take(core)
    assert client_replies(out) == []  # the late reply is dropped
    assert [job.items for _, job in dispatched(out)] == [1]


def test_no_worker_answers_after_the_grace(clock: FakeClock) -> None:
    core = make_core(clock)
    send(core, b"r")
    clock.advance(0.499)
    core.tick()
    assert client_replies(take(core)) == []
    clock.advance(0.002)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.NO_WORKER


def test_a_worker_arriving_within_the_grace_gets_the_request(clock: FakeClock) -> None:
    core = make_core(clock)
    send(core, b"r")
    clock.advance(0.3)
    ready(core, b"W1")
    assert len(dispatched(take(core))) == 1


def test_unknown_model_is_refused_after_startup(clock: FakeClock) -> None:
    core = make_core(clock)
    clock.advance(1.0)
    send(core, b"r", model="nope")
    [reply] = client_replies(take(core))
    assert reply.status is Status.UNKNOWN_MODEL and "nope" in reply.message
    assert "nope" not in core.models


def test_unknown_model_during_startup_waits_the_grace_then_is_unknown(clock: FakeClock) -> None:
    core = make_core(clock)
    send(core, b"r", model="later")
    clock.advance(0.6)
    core.tick()
    [reply] = client_replies(take(core))
    assert reply.status is Status.UNKNOWN_MODEL
    assert "later" not in core.models


def test_silent_worker_is_expired_even_when_busy_and_its_work_goes_elsewhere(clock: FakeClock) -> None:
    core = make_core(clock, heartbeat_ms=100, heartbeat_liveness=3)
    ready(core, b"W1", capacity=1)
    send(core, b"r")
    [(first, job)] = dispatched(take(core))
    assert first == b"W1"
    ready(core, b"W2", capacity=1)
    clock.advance(0.2)
    core.worker_message(b"W2", wire.encode_heartbeat())
    clock.advance(0.15)
    core.tick()
    [(second, again)] = dispatched(take(core))
    assert second == b"W2" and again.payload == b"P"
    worker_reply(core, b"W1", job.request_id)  # the expired worker's late reply
    out = take(core)
    assert client_replies(out) == []
    assert out[0][0] is Peer.WORKER and out[0][2][0] == wire.HEADERS[wire.Command.DISCONNECT]
    worker_reply(core, b"W2", again.request_id)
    assert [r.status for r in client_replies(take(core))] == [Status.OK]


def test_retry_budget_then_worker_error(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=1)
    ready(core, b"W1")
    send(core, b"poison")
    take(core)
    core.worker_message(b"W1", wire.encode_disconnect("crashed"))
    ready(core, b"W2")
    assert len(dispatched(take(core))) == 1
    core.worker_message(b"W2", wire.encode_disconnect("crashed"))
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_ERROR and "died 2 times" in reply.message


def test_spent_retry_budget_is_worker_lost(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=0)
    ready(core, b"W1")
    send(core, b"r")
    take(core)
    core.worker_message(b"W1", wire.encode_disconnect("crashed"))
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_LOST


def test_cancel_removes_a_waiting_request_and_forwards_for_a_running_one(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    ready(core, b"W1", capacity=1)
    send(core, b"running")
    send(core, b"waiting")
    [(_, job)] = dispatched(take(core))
    core.client_message(b"C", wire.encode_cancel(b"waiting"))
    assert core.stats()["models"][MODEL]["backlog_items"] == 0
    core.client_message(b"C", wire.encode_cancel(b"running"))
    [(peer, _worker, frames)] = take(core)
    assert peer is Peer.WORKER and wire.decode_broker_to_worker(frames) == wire.Cancel(job.request_id)
    worker_reply(core, b"W1", job.request_id, Status.CANCELLED)
    assert client_replies(take(core)) == []


def test_another_client_cannot_cancel_or_collide(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    send(core, b"same", client=b"A")
    send(core, b"same", client=b"B")
    core.client_message(b"B", wire.encode_cancel(b"same"))
    ready(core, b"W1")
    assert len(dispatched(take(core))) == 1  # A's request still runs


def test_a_duplicate_request_id_is_dropped_so_the_live_request_keeps_its_one_answer(clock: FakeClock) -> None:
    """An answer to the duplicate would carry the live request's id and settle it early."""
    core = make_core(clock, no_worker_grace_ms=10_000)
    send(core, b"dup")
    send(core, b"dup")
    core.client_message(b"C", wire.encode_stats_query(b"dup"))  # an ok STATS would settle it too
    assert client_replies(take(core)) == []
    ready(core, b"W1")
    [(_, job)] = dispatched(take(core))
    worker_reply(core, b"W1", job.request_id)
    [reply] = client_replies(take(core))
    assert (reply.request_id, reply.status, reply.payload) == (b"dup", Status.OK, b"result")


def test_malformed_client_message_gets_bad_request_when_it_has_an_id(clock: FakeClock) -> None:
    core = make_core(clock)
    core.client_message(b"C", [b"ZB\x01\x02", b"rid", b"\xc1", b""])
    core.client_message(b"C", [b"garbage"])
    [reply] = client_replies(take(core))
    assert reply.request_id == b"rid" and reply.status is Status.BAD_REQUEST


def test_unregistered_worker_is_told_to_register(clock: FakeClock) -> None:
    core = make_core(clock)
    core.worker_message(b"ghost", wire.encode_heartbeat())
    [(peer, identity, frames)] = take(core)
    assert (peer, identity) == (Peer.WORKER, b"ghost")
    assert isinstance(wire.decode_broker_to_worker(frames), wire.Disconnect)


def test_an_answered_request_sets_no_wake_at_its_old_deadline(clock: FakeClock) -> None:
    """Every request arms a timer at its deadline; once answered, the broker must not wake for it (at load, a wake a
    request), while a request still owed keeps its own."""
    core = make_core(clock, heartbeat_ms=10_000, timeout_ms=100)
    ready(core, b"W1", capacity=1)
    send(core, b"answered")
    [(_, job)] = dispatched(take(core))
    clock.advance(0.01)
    send(core, b"waiting")
    worker_reply(core, b"W1", job.request_id)
    core.tick()
    [(_, waiting)] = dispatched(take(core))
    assert core.next_wakeup() == pytest.approx(clock.now + 0.1)  # the waiting request's deadline, not the first's
    worker_reply(core, b"W1", waiting.request_id)
    core.tick()
    assert [r.request_id for r in client_replies(take(core))] == [b"waiting"]
    assert core.next_wakeup() > clock.now + 1.0  # nothing owed: the next wake is liveness's, not a deadline


def test_heartbeats_are_sent_every_interval(clock: FakeClock) -> None:
    core = make_core(clock, heartbeat_ms=100)
    ready(core, b"W1")
    core.tick()
    assert len(take(core)) == 1
    clock.advance(0.05)
    core.tick()
    assert take(core) == []
    assert core.next_wakeup() == pytest.approx(clock.now + 0.05)
    clock.advance(0.051)
    core.tick()
    assert len(take(core)) == 1


def test_stats_report_batches_from_heartbeats(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    core.worker_message(b"W1", wire.encode_heartbeat(Heartbeat({MODEL: BatchCounters(2, 7)})))
    core.client_message(b"C", wire.encode_stats_query(b"s"))
    [reply] = client_replies(take(core))
    stats = payloads.decode_payload(reply.payload)
    model = stats["models"][MODEL]
    assert (model["batches"], model["batched_items"], model["mean_batch_size"]) == (2, 7, 3.5)
    assert stats["workers"][0]["free_credit"] == 4


def test_stats_show_what_the_newest_worker_announced_about_each_model(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    info = ModelInfo(MODEL, "text-classification", 8, max_length=512, dtype="float32", labels=("neg", "pos"))
    core.worker_message(b"W2", wire.encode_ready(Ready((info,), 4, "w2")))
    core.client_message(b"C", wire.encode_stats_query(b"s"))
    [reply] = client_replies(take(core))
    assert payloads.decode_payload(reply.payload)["models"][MODEL]["info"] == {
        "task": "text-classification", "max_batch_size": 8, "max_length": 512, "dtype": "float32",
        "labels": ["neg", "pos"]}
    core.worker_message(b"W1", wire.encode_disconnect())
    core.worker_message(b"W2", wire.encode_disconnect())
    core.client_message(b"C", wire.encode_stats_query(b"t"))
    [reply] = client_replies(take(core))
    assert payloads.decode_payload(reply.payload)["models"][MODEL]["info"] == {}


def test_drain_refuses_new_work_and_abandon_answers_the_rest(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    send(core, b"held")
    core.begin_drain()
    send(core, b"new")
    [refused] = client_replies(take(core))
    assert refused.request_id == b"new" and refused.status is Status.OVERLOADED
    assert not core.idle
    core.abandon_all("stopping")
    [left] = client_replies(take(core))
    assert left.request_id == b"held" and core.idle


def test_config_is_frozen() -> None:
    config = BrokerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_backlog = 1  # type: ignore[misc]


def test_job_ids_differ_between_broker_instances(clock: FakeClock) -> None:
    ids = []
    for _ in range(2):
        core = make_core(clock)
        ready(core, b"W1")
        send(core, b"r")
        [(_, job)] = dispatched(take(core))
        ids.append(job.request_id)
    assert ids[0] != ids[1]


def test_a_reconnecting_worker_flushing_old_messages_is_asked_to_register_once(clock: FakeClock) -> None:
    core = make_core(clock, heartbeat_ms=100)
    for _ in range(5):
        core.worker_message(b"W1", wire.encode_heartbeat())
    assert len(take(core)) == 1
    clock.advance(0.1)
    core.worker_message(b"W1", wire.encode_heartbeat())
    assert len(take(core)) == 1


def test_reconnection_of_the_same_process_requeues_without_charging_retries(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=0)
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo(MODEL, "e", 2),), 4, "w", "h", 7)))
    send(core, b"r")
    take(core)
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo(MODEL, "e", 2),), 4, "w", "h", 7)))
    out = take(core)
    assert client_replies(out) == [] and len(dispatched(out)) == 1  # sent again, budget untouched
    core.worker_message(b"W1", wire.encode_ready(Ready((ModelInfo(MODEL, "e", 2),), 4, "w", "h", 8)))
    [reply] = client_replies(take(core))
    assert reply.status is Status.WORKER_LOST  # a new pid: the old process died with the job


def test_draining_worker_gets_no_new_work_and_its_clean_exit_charges_nothing(clock: FakeClock) -> None:
    core = make_core(clock, max_retries=0, no_worker_grace_ms=10_000)
    ready(core, b"W1")
    send(core, b"held")
    take(core)
    core.worker_message(b"W1", wire.encode_drain())
    [(_peer, _identity, frames)] = take(core)
    assert isinstance(wire.decode_broker_to_worker(frames), wire.Drain)
    send(core, b"new")
    assert dispatched(take(core)) == []
    core.worker_message(b"W1", wire.encode_disconnect("stopping"))
    ready(core, b"W2")
    assert len(dispatched(take(core))) == 2  # both go to the new worker; nothing failed


def test_a_job_whose_worker_died_runs_alone_on_an_idle_worker(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    ready(core, b"W1", capacity=4)
    send(core, b"suspect")
    take(core)
    core.worker_message(b"W1", wire.encode_disconnect("crashed"))
    ready(core, b"W2", capacity=4)
    [(_, suspect)] = dispatched(take(core))
    send(core, b"innocent")
    assert dispatched(take(core)) == []  # nothing joins the suspect on W2
    worker_reply(core, b"W2", suspect.request_id)
    out = take(core)
    assert [r.request_id for r in client_replies(out)] == [b"suspect"] and len(dispatched(out)) == 1


def test_higher_priority_is_dispatched_first(clock: FakeClock) -> None:
    core = make_core(clock, no_worker_grace_ms=10_000)
    send(core, b"low", priority=2)
    send(core, b"normal")
    send(core, b"high", priority=0)
    ready(core, b"W1", capacity=1)
    order = []
    for _ in range(3):
        [(_, job)] = dispatched(take(core))
        order.append(job.priority)
        worker_reply(core, b"W1", job.request_id)
    assert order == [0, 1, 2]


def test_under_overload_low_priority_is_refused_first_and_high_last(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog=8, priority_reserve=0.25, no_worker_grace_ms=10_000)
    send(core, b"fill", items=6)
    send(core, b"low", priority=2)  # 6 + 1 > 8 * 0.75
    send(core, b"normal", items=2)  # 6 + 2 <= 8
    send(core, b"high", priority=0, items=2)  # 8 + 2 <= 8 * 1.25
    send(core, b"normal-2")  # 10 + 1 > 8
    replies = {r.request_id: r.status for r in client_replies(take(core))}
    assert replies == {b"low": Status.OVERLOADED, b"normal-2": Status.OVERLOADED}


def test_trace_and_priority_reach_the_worker(clock: FakeClock) -> None:
    core = make_core(clock)
    ready(core, b"W1")
    send(core, b"r", priority=0, trace="req-123")
    [(_, job)] = dispatched(take(core))
    assert (job.priority, job.trace) == (0, "req-123")


def test_per_model_limits_override_the_broker_wide_ones(clock: FakeClock) -> None:
    core = make_core(clock, max_backlog=8, model_limits="name=m,max_backlog=2,timeout_ms=300,max_timeout_ms=400",
                     no_worker_grace_ms=10_000)
    send(core, b"a", items=2)
    send(core, b"b")
    [refused] = client_replies(take(core))
    assert refused.request_id == b"b" and refused.status is Status.OVERLOADED
    ready(core, b"W1")
    send(core, b"c", timeout_ms=999)
    jobs = [job for _, job in dispatched(take(core))]
    assert [job.timeout_ms for job in jobs] == [300, 400]


def test_bad_model_limits_fail_at_start() -> None:
    from broker.config import load_config

    with pytest.raises(SystemExit):
        load_config(["--model-limits", "name=m,max_backlog=lots"], {})
