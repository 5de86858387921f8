"""Wire protocol v1: round trips and rejections, no sockets."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import (
    BatchCounters,
    Cancel,
    Command,
    Disconnect,
    Heartbeat,
    ModelInfo,
    ProtocolError,
    Ready,
    Reply,
    Request,
    StatsQuery,
    Status,
)


def test_header_is_signature_version_command() -> None:
    assert wire.HEADERS[Command.REQUEST] == b"ZB\x01\x02"


@pytest.mark.parametrize("timeout_ms", [None, 250])
def test_request_round_trip(timeout_ms: int | None) -> None:
    request = Request(b"id-1", "all-MiniLM-L6-v2", 3, b"\x93\x01\x02\x03", timeout_ms)
    assert wire.decode_client_message(wire.encode_request(request)) == request
    assert wire.decode_broker_to_worker(wire.encode_request(request)) == request


def test_reply_round_trip_and_readdress() -> None:
    reply = Reply(b"job", Status.OVERLOADED, "busy", b"", retry_after_ms=1000)
    frames = wire.encode_reply(reply)
    assert wire.decode_reply(frames) == reply
    forwarded = wire.readdressed_reply(b"client-id", frames[2], frames[3])
    assert wire.decode_reply(forwarded) == Reply(b"client-id", Status.OVERLOADED, "busy", b"", 1000)
    assert forwarded[2] is frames[2] and forwarded[3] is frames[3]  # meta and payload untouched


def test_a_grouped_request_says_so_and_an_ungrouped_one_sends_no_key() -> None:
    grouped = Request(b"id-1", "m", 1, b"", grouped=True)
    assert wire.decode_client_message(wire.encode_request(grouped)) == grouped
    assert msgpack.unpackb(wire.encode_request(grouped)[2])["grouped"] is True
    assert "grouped" not in msgpack.unpackb(wire.encode_request(Request(b"id-1", "m", 1, b""))[2])
    with pytest.raises(ProtocolError, match="'grouped' must be of type bool"):
        wire.decode_client_message([wire.HEADERS[Command.REQUEST], b"r", msgpack.packb(
            {"model": "m", "items": 1, "grouped": 1}), b""])


def test_grouped_answers_round_trip_each_as_its_own_reply() -> None:
    replies = [Reply(b"a", Status.OK, "", b"\x01\x02"), Reply(b"b", Status.WORKER_ERROR, "broke"),
               Reply(b"c", Status.OVERLOADED, "full", b"", 500)]
    [frames] = wire.encode_grouped(replies)
    assert frames[0] == wire.HEADERS[Command.REPLIES] and len(frames) == 1 + 3 * len(replies)
    decoded = wire.decode_worker_message(frames)
    assert isinstance(decoded, wire.GroupedReplies) and list(decoded.replies) == replies
    assert decoded.metas == tuple(frames[2::3])  # each meta frame kept for the broker to forward untouched
    assert [wire.decode_reply(answer) for answer in wire.split_grouped(frames)] == replies


def test_one_answer_goes_as_a_plain_reply() -> None:
    reply = Reply(b"a", Status.OK, "", b"x")
    assert wire.encode_grouped([reply]) == [wire.encode_reply(reply)]
    assert wire.encode_grouped([]) == []


def test_grouping_splits_at_the_answer_and_byte_limits() -> None:
    many = [Reply(i.to_bytes(4, "big"), Status.OK, "", b"p") for i in range(wire.MAX_GROUPED_REPLIES + 3)]
    counts = [(len(frames) - 1) // 3 for frames in wire.encode_grouped(many)]
    assert counts == [wire.MAX_GROUPED_REPLIES, 3]
    big = b"x" * (wire.MAX_GROUPED_BYTES // 2 + 1)
    sizes = [(len(frames) - 1) // 3 for frames in wire.encode_grouped([Reply(b"%d" % i, Status.OK, "", big)
                                                                          for i in range(5)])]
    assert sizes == [1, 1, 1, 1, 1]  # two never fit under the byte limit together
    assert all(len(frames) == 4 for frames in wire.encode_grouped([Reply(b"1", Status.OK, "", big)] * 2))
    payload = b"y" * 100
    assert [(len(f) - 1) // 3 for f in wire.encode_grouped([Reply(b"%d" % i, Status.OK, "", payload)
                                                             for i in range(3)])] == [3]


@pytest.mark.parametrize("frames, match", [
    ([wire.HEADERS[Command.REPLIES]], "1 to 1024 answers"),
    ([wire.HEADERS[Command.REPLIES], b"a", wire.pack({"status": "ok"})], "1 to 1024 answers"),
    ([wire.HEADERS[Command.REPLIES]] + [b"a", wire.pack({"status": "ok"}), b""] * 1025, "1 to 1024 answers"),
    ([wire.HEADERS[Command.REPLIES], b"a", wire.pack({"status": "ok"}), b"", b"", wire.pack({"status": "ok"}),
      b""], "request id"),
    ([wire.HEADERS[Command.REPLIES], b"a", wire.pack({"status": "ok"}), b"", b"b", wire.pack({"status": "maybe"}),
      b""], "unknown status"),
])
def test_a_worker_s_grouped_answers_are_malformed_whole_if_one_is(frames: list[bytes], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        wire.decode_worker_message(frames)


def test_grouped_answers_come_only_from_workers() -> None:
    [frames] = wire.encode_grouped([Reply(b"a", Status.OK), Reply(b"b", Status.OK)])
    for decode in (wire.decode_client_message, wire.decode_broker_to_worker):
        with pytest.raises(ProtocolError, match="REPLIES is not allowed"):
            decode(frames)


def test_a_worker_says_in_ready_that_it_takes_grouped_requests() -> None:
    grouped = Ready((ModelInfo("m", "embeddings", 32),), 64, grouped=True)
    assert wire.decode_worker_message(wire.encode_ready(grouped)) == grouped
    assert "grouped" not in msgpack.unpackb(wire.encode_ready(Ready((ModelInfo("m", "e", 1),), 1))[1])


def test_worker_messages_round_trip() -> None:
    ready = Ready((ModelInfo("m", "embeddings", 32),), 64, "w0", "host", 42, "cuda:0")
    assert wire.decode_worker_message(wire.encode_ready(ready)) == ready
    heartbeat = Heartbeat({"m": BatchCounters(3, 40)})
    assert wire.decode_worker_message(wire.encode_heartbeat(heartbeat)) == heartbeat
    busy = Heartbeat({"m": BatchCounters(3, 40, busy_ms=1234)})
    assert wire.decode_worker_message(wire.encode_heartbeat(busy)) == busy
    assert wire.decode_worker_message(wire.encode_heartbeat()) == Heartbeat()
    assert wire.decode_worker_message(wire.encode_disconnect("bye")) == Disconnect("bye")


def test_busy_time_is_optional_in_heartbeats_so_older_workers_stay_valid() -> None:
    """An older worker sends no ``busy_ms``; a newer one leaves it out until its first batch has run."""
    meta = msgpack.unpackb(wire.encode_heartbeat(Heartbeat({"m": BatchCounters(1, 2)}))[1])
    assert meta == {"batches": {"m": {"batches": 1, "items": 2, "cancelled": 0, "expired": 0}}}
    older = [wire.HEADERS[wire.Command.HEARTBEAT], msgpack.packb({"batches": {"m": {"batches": 1, "items": 2}}})]
    assert wire.decode_worker_message(older) == Heartbeat({"m": BatchCounters(1, 2)})


def test_ready_carries_what_the_dialects_need_to_know_about_a_model() -> None:
    info = ModelInfo("e", "embeddings", 32, max_length=256, dimensions=384, dtype="float32",
                     tokenizer=payloads.tokenizer_fingerprint("{}"), max_batch_tokens=16384)
    labelled = ModelInfo("c", "text-classification", 8, 512, None, "bfloat16", ("negative", "positive"))
    ready = Ready((info, labelled), 64)
    assert wire.decode_worker_message(wire.encode_ready(ready)) == ready
    meta = msgpack.unpackb(wire.encode_ready(Ready((ModelInfo("m", "t", 1),), 1))[1])
    assert meta["models"] == [{"name": "m", "task": "t", "max_batch_size": 1}]  # unknowns are not sent


@pytest.mark.parametrize(("extra", "complaint"), [
    ({"max_length": 0}, "max_length must be 1 to"),
    ({"max_length": 2**24 + 1}, "max_length must be 1 to"),
    ({"dimensions": "384"}, "'dimensions' must be of type int"),
    ({"dimensions": 2**20 + 1}, "dimensions must be 1 to"),
    ({"dtype": "float\n32"}, "dtype must have"),
    ({"dtype": "x" * 33}, "dtype must have"),
    ({"labels": "a,b"}, "'labels' must be of type list"),
    ({"labels": ["a"] * 257}, "at most 256 labels"),
    ({"labels": ["a", 1]}, "labels must be strings"),
    ({"labels": ["a", ""]}, "a label must have"),
    ({"labels": ["x" * 129]}, "a label must have"),
    ({"tokenizer": "9114256B104CCA80"}, "tokenizer must be 16 lowercase hexadecimal digits"),
    ({"tokenizer": "9114256b104cca8"}, "tokenizer must be 16 lowercase hexadecimal digits"),
    ({"tokenizer": 7}, "'tokenizer' must be of type str"),
    ({"max_batch_tokens": 0}, "max_batch_tokens must be 1 to"),
    ({"max_batch_tokens": 2**31 + 1}, "max_batch_tokens must be 1 to"),
    ({"max_batch_tokens": 1.5}, "'max_batch_tokens' must be of type int"),
    ({"colour": "red"}, "unknown field(s): colour"),
])
def test_ready_model_details_are_decoded_strictly(extra: dict[str, object], complaint: str) -> None:
    model = {"name": "m", "task": "t", "max_batch_size": 1} | extra
    with pytest.raises(ProtocolError) as refusal:
        wire.decode_worker_message([wire.HEADERS[Command.READY], _meta(models=[model], capacity=4)])
    assert complaint in str(refusal.value)


def test_client_control_messages() -> None:
    assert wire.decode_client_message(wire.encode_cancel(b"r1")) == Cancel(b"r1")
    assert wire.decode_client_message(wire.encode_stats_query(b"r2")) == StatsQuery(b"r2")


def _meta(**fields: object) -> bytes:
    packed: bytes = msgpack.packb(fields)
    return packed


@pytest.mark.parametrize(
    ("frames", "complaint"),
    [
        ([], "empty message"),
        ([b"XX\x01\x02", b"id", _meta(model="m", items=1), b""], "not a zbatch header"),
        ([b"ZB\x02\x02", b"id", _meta(model="m", items=1), b""], "version 2 is not supported"),
        ([b"ZB\x01\x63"], "unknown command 99"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items=1)], "expected 4 frames"),
        ([b"ZB\x01\x02", b"", _meta(model="m", items=1), b""], "request id must be"),
        ([b"ZB\x01\x02", b"x" * 65, _meta(model="m", items=1), b""], "request id must be"),
        ([b"ZB\x01\x02", b"id", b"\xc1garbage", b""], "not valid msgpack"),
        ([b"ZB\x01\x02", b"id", msgpack.packb([1, 2]), b""], "must be a msgpack map"),
        ([b"ZB\x01\x02", b"id", _meta(items=1), b""], "missing field 'model'"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items="1"), b""], "'items' must be of type int"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items=True), b""], "'items' must be of type int"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items=0), b""], "items must be at least 1"),
        ([b"ZB\x01\x02", b"id", _meta(model="", items=1), b""], "model name must have"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items=1, timeout_ms=0), b""], "timeout_ms must be"),
        ([b"ZB\x01\x02", b"id", _meta(model="m", items=1, evil=1), b""], "unknown field(s): evil"),
        ([b"ZB\x01\x01", _meta(models=[], capacity=1)], "not allowed from a client"),
    ],
)
def test_client_decoder_rejects(frames: list[bytes], complaint: str) -> None:
    with pytest.raises(ProtocolError, match=None) as info:
        wire.decode_client_message(frames)
    assert complaint in str(info.value)


def test_worker_decoder_rejects_client_commands_and_bad_ready() -> None:
    with pytest.raises(ProtocolError, match="not allowed from a worker"):
        wire.decode_worker_message(wire.encode_stats_query(b"x"))
    with pytest.raises(ProtocolError, match="at least one model"):
        wire.decode_worker_message([wire.HEADERS[Command.READY], _meta(models=[], capacity=4)])
    bad_model = _meta(models=[{"name": "m", "task": "t", "max_batch_size": 0}], capacity=4)
    with pytest.raises(ProtocolError, match="max_batch_size"):
        wire.decode_worker_message([wire.HEADERS[Command.READY], bad_model])
    with pytest.raises(ProtocolError, match="unknown status"):
        wire.decode_reply([wire.HEADERS[Command.REPLY], b"id", _meta(status="meh"), b""])


def test_request_id_is_recovered_from_malformed_messages() -> None:
    assert wire.request_id_of([b"ZB\x09\x02", b"abc"]) == b"abc"
    assert wire.request_id_of([b"junk"]) is None
    assert wire.request_id_of([b"ZB\x01\x02", b"x" * 100]) is None


def test_payload_arrays_travel_as_little_endian_bytes() -> None:
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    encoded = payloads.encode_payload({"outputs": [matrix, np.int64(7), "text"]})
    assert matrix.tobytes() in encoded  # raw bytes, not a list of floats
    decoded = payloads.decode_payload(encoded)["outputs"]
    np.testing.assert_array_equal(decoded[0], matrix)
    assert decoded[0].dtype == np.float32 and decoded[1:] == [7, "text"]
    big_endian = np.arange(3, dtype=">f8")
    np.testing.assert_array_equal(payloads.decode_payload(payloads.encode_payload(big_endian)), big_endian)


@pytest.mark.parametrize(
    "ext",
    [
        msgpack.ExtType(9, b"x"),
        msgpack.ExtType(1, b"\xc1"),
        msgpack.ExtType(1, msgpack.packb(["<f4", [2], b"\x00" * 4])),
        msgpack.ExtType(1, msgpack.packb(["|O", [1], b"\x00" * 8])),
        msgpack.ExtType(1, msgpack.packb(["<f4", [-1], b""])),
    ],
)
def test_payload_rejects_bad_extensions(ext: msgpack.ExtType) -> None:
    with pytest.raises(ProtocolError):
        payloads.decode_payload(msgpack.packb({"outputs": [ext]}))


def test_a_payload_that_cannot_be_encoded_leaves_nothing_behind_for_the_next() -> None:
    """The packer is reused per thread: a failed pack must not leak its partial bytes into the next payload."""
    with pytest.raises(TypeError, match="cannot encode"):
        payloads.encode_payload({"outputs": [np.ones(3, np.float32), object()]})
    with pytest.raises(TypeError, match="cannot be sent"):
        payloads.encode_payload({"outputs": [np.array(["text"])]})
    body = {"outputs": [np.arange(4, dtype=np.float32)], "tokens": [4]}
    decoded = payloads.decode_payload(payloads.encode_payload(body))
    assert decoded["tokens"] == [4] and decoded["outputs"][0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_meta_packing_is_msgpacks_and_a_failure_leaves_nothing_behind() -> None:
    """Meta frames come from a packer reused per thread: the bytes ``msgpack.packb`` would write, a failed pack
    leaves nothing for the next one, and threads packing at once never share a buffer."""
    import threading

    value = {"model": "m", "items": 3, "bytes": b"\x00\xff", "nested": [1.5, None, True]}
    assert wire.pack(value) == msgpack.packb(value, use_bin_type=True)
    with pytest.raises(TypeError):
        wire.pack({"first": 1, "bad": object()})
    assert wire.pack([7]) == b"\x91\x07"
    mismatches: list[int] = []

    def pack_many(worker: int) -> None:
        for index in range(2_000):
            mine = {"worker": worker, "index": index, "pad": bytes(worker * 50)}
            if msgpack.unpackb(wire.pack(mine)) != mine:
                mismatches.append(worker)

    threads = [threading.Thread(target=pack_many, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert mismatches == [] and not any(thread.is_alive() for thread in threads)


def test_payload_rejects_garbage_and_oversize() -> None:
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        payloads.decode_payload(b"\xc1\xc1")
    with pytest.raises(ProtocolError, match="larger than"):
        payloads.decode_payload(b"\x00" * 11, max_bytes=10)


def test_priority_and_trace_are_optional_and_checked() -> None:
    request = Request(b"id", "m", 1, b"", None, 0, "abc-1")
    assert wire.decode_client_message(wire.encode_request(request)) == request
    assert len(wire.encode_request(Request(b"id", "m", 1, b""))[2]) < 20  # defaults are not sent
    for meta in (_meta(model="m", items=1, priority=3), _meta(model="m", items=1, trace="a\nb")):
        with pytest.raises(ProtocolError):
            wire.decode_client_message([b"ZB\x01\x02", b"id", meta, b""])
