"""Batch formation and one reply per request, without sockets or threads."""

from __future__ import annotations

from typing import Any

from worker.assembler import Assembler, Counted, ItemFailure, PendingRequest
from worker.requests import parameters_key
from zbatch.protocol import payloads
from zbatch.protocol.wire import Status


def pending(job_id: bytes, n: int, deadline: float = 100.0, parameters: dict[str, Any] | None = None) -> PendingRequest:
    params = parameters or {}
    inputs = [f"{job_id.decode()}-{i}" for i in range(n)]
    return PendingRequest(job_id, inputs, params, repr(params).encode(), deadline, 0.0)


def test_batches_cap_items_and_split_requests_across_batches() -> None:
    a = Assembler()
    a.add(pending(b"a", 3))
    a.add(pending(b"b", 3))
    first = a.take_batch(4)
    assert first is not None and first.inputs == ["a-0", "a-1", "a-2", "b-0"]
    assert a.pending_items == 2
    second = a.take_batch(4)
    assert second is not None and second.inputs == ["b-1", "b-2"]
    assert a.take_batch(4) is None


def test_reply_when_the_last_item_is_done_with_outputs_in_order() -> None:
    a = Assembler()
    a.add(pending(b"a", 3))
    first = a.take_batch(2)
    second = a.take_batch(2)
    assert first is not None and second is not None
    assert a.complete(second, ["out-2"]) == []
    [reply] = a.complete(first, ["out-0", "out-1"])
    assert reply.status is Status.OK
    assert payloads.decode_payload(reply.payload) == {"outputs": ["out-0", "out-1", "out-2"]}
    assert len(a) == 0


def test_a_batch_never_mixes_parameters() -> None:
    a = Assembler()
    a.add(pending(b"a", 1))
    a.add(pending(b"b", 1, parameters={"top_k": 2}))
    a.add(pending(b"c", 1))
    batch = a.take_batch(8)
    assert batch is not None and batch.inputs == ["a-0"]


def test_expired_requests_are_answered_and_never_batched() -> None:
    a = Assembler()
    a.add(pending(b"old", 2, deadline=1.0))
    a.add(pending(b"new", 1, deadline=10.0))
    [reply] = a.expire(now=1.0)
    assert reply.request_id == b"old" and reply.status is Status.DEADLINE_EXCEEDED
    batch = a.take_batch(8)
    assert batch is not None and batch.inputs == ["new-0"]
    assert a.pending_items == 0


def test_a_failing_item_fails_only_its_request_once() -> None:
    a = Assembler()
    a.add(pending(b"bad", 2))
    a.add(pending(b"good", 1))
    batch = a.take_batch(8)
    assert batch is not None
    failure = ItemFailure(Status.WORKER_ERROR, "inference failed")
    replies = a.complete(batch, [failure, failure, "fine"])
    assert [(r.request_id, r.status) for r in replies] == [(b"bad", Status.WORKER_ERROR), (b"good", Status.OK)]


def test_cancel_skips_items_not_yet_started() -> None:
    a = Assembler()
    a.add(pending(b"a", 1))
    a.add(pending(b"b", 1))
    reply = a.cancel(b"a")
    assert reply is not None and reply.status is Status.CANCELLED
    assert a.cancel(b"a") is None
    batch = a.take_batch(8)
    assert batch is not None and batch.inputs == ["b-0"]
    assert a.first_arrival() == float("inf")


def test_skipped_items_are_counted_by_reason() -> None:
    a = Assembler()
    a.add(pending(b"a", 2))
    a.add(pending(b"b", 3, deadline=1.0))
    a.cancel(b"a")
    a.expire(now=2.0)
    assert a.skipped_items == {Status.CANCELLED: 2, Status.DEADLINE_EXCEEDED: 3}


def test_token_counts_join_the_reply_when_the_runner_counted_every_input() -> None:
    a = Assembler()
    a.add(pending(b"a", 2))
    a.add(pending(b"b", 1))
    batch = a.take_batch(3)
    assert batch is not None
    counted, plain = a.complete(batch, [Counted("out-0", 5), Counted("out-1", 7), "uncounted"])
    assert payloads.decode_payload(counted.payload) == {"outputs": ["out-0", "out-1"], "tokens": [5, 7]}
    assert payloads.decode_payload(plain.payload) == {"outputs": ["uncounted"]}


def test_counted_outputs_give_one_count_per_input_in_order() -> None:
    a = Assembler()
    a.add(pending(b"a", 3))
    first, second = a.take_batch(2), a.take_batch(2)
    assert first is not None and second is not None
    assert a.complete(second, [Counted("out-2", 9)]) == []
    [reply] = a.complete(first, [Counted("out-0", 4), Counted("out-1", 6)])
    assert payloads.decode_payload(reply.payload) == {"outputs": ["out-0", "out-1", "out-2"], "tokens": [4, 6, 9]}


def test_an_input_refused_alone_is_named_by_its_index_in_the_request() -> None:
    a = Assembler()
    a.add(pending(b"ok", 1))
    a.add(pending(b"bad", 3))
    batch = a.take_batch(8)
    assert batch is not None
    refused = ItemFailure(Status.BAD_REQUEST, "the image is too large", per_input=True)
    replies = a.complete(batch, ["fine", "fine", "fine", refused])
    assert [(r.request_id, r.status, r.message) for r in replies] == [
        (b"ok", Status.OK, ""), (b"bad", Status.BAD_REQUEST, "inputs[2]: the image is too large")]


def test_operations_never_share_a_batch() -> None:
    a = Assembler()
    for job_id, operation in ((b"run", "run"), (b"tokens", "tokenize"), (b"run-2", "run")):
        request = pending(job_id, 1)
        request.operation, request.parameters_key = operation, parameters_key({}, operation)
        a.add(request)
    batches = [a.take_batch(8) for _ in range(3)]
    assert [(b.operation, b.inputs) for b in batches if b is not None] == [
        ("run", ["run-0"]), ("tokenize", ["tokens-0"]), ("run", ["run-2-0"])]
