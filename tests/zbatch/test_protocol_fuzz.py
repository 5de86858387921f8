"""Hostile input, generated: no decoder raises anything but ProtocolError, and the broker core
never crashes and answers every request it can address exactly once.

The examples start from the valid messages of PROTOCOL.md section 9 and break them (flipped
bytes, truncated, duplicated, swapped, dropped or foreign frames, random meta maps), next to
plain random frame lists.  The profile is fixed (derandomized, no example database), so a run
is repeatable and takes seconds.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core import BrokerCore, CoreSettings, Peer
from tests.zbatch.protocol_examples import EXAMPLES, expected_replies
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import (
    Cancel,
    Command,
    Disconnect,
    Drain,
    GroupedReplies,
    Heartbeat,
    ModelInfo,
    ProtocolError,
    Ready,
    Reply,
    Request,
    StatsQuery,
    Status,
)

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=800,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Traffic through the core is lists of messages, dearer to generate: fewer examples.
FUZZ_TRAFFIC = settings(FUZZ, max_examples=300)
FUZZ_PAYLOAD = settings(FUZZ, max_examples=600)
DECODERS: tuple[Callable[[list[bytes]], Any], ...] = (
    wire.decode_client_message,
    wire.decode_worker_message,
    wire.decode_broker_to_worker,
    wire.decode_reply,
    wire.decode_header,
)
META_KEYS = ("model", "items", "timeout_ms", "priority", "trace", "status", "message", "retry_after_ms",
             "models", "capacity", "name", "host", "pid", "device", "batches", "reason", "task",
             "max_batch_size", "cancelled", "expired")
DTYPES = ("<f4", "<f8", "|u1", "|b1", "<i8", "<f2", ">f4", "<U4", "|O", "V8", "f4,f4", "(2,)<f4", "a", "",
          "S0", "<M8[s]", "<c8", "<f3", "|f1", "<b2")
GOOD_DTYPES = ("<f4", "<f8", "|u1", "|b1", "<i8", "<f2", "|i1")


def _packb(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=40) | st.binary(max_size=40))


def _ext(children: st.SearchStrategy[Any]) -> st.SearchStrategy[msgpack.ExtType]:
    """Extension values, mostly type 1 with arrays that are valid or lie about dtype, shape or length."""
    dims = st.lists(st.integers(0, 4), max_size=3)
    good = st.tuples(st.sampled_from(GOOD_DTYPES), dims).map(
        lambda p: [p[0], p[1], bytes(math.prod(p[1]) * np.dtype(p[0]).itemsize)])
    dtype = st.sampled_from(DTYPES) | children
    shape = st.lists(st.integers(-2, 2**64 - 1) | st.sampled_from([0, 1, 2, 3, 2**32, 2**62]), max_size=70) | children
    data = st.binary(max_size=64) | children
    parts = st.tuples(dtype, shape, data).map(list) | st.lists(dtype | shape | data, max_size=4) | children
    code = st.sampled_from((1, 1, 1, 0, 2, 127))
    return (st.builds(lambda c, body: msgpack.ExtType(c, _packb(body)), code, good | parts)
            | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=32)))


values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
                      | _ext(children)),
    max_leaves=10,
)
meta_maps = st.dictionaries(st.sampled_from(META_KEYS) | st.text(max_size=12), values, max_size=8)
# Near the schema's types, small integers and short strings get past more type checks.
field_values = st.integers(-1, 3) | st.text(max_size=3) | values
packed = values.map(_packb)
packed_meta = meta_maps.map(_packb)
headers = st.sampled_from(list(wire.HEADERS.values())) | st.binary(min_size=4, max_size=4).map(
    lambda raw: b"ZB" + raw[2:])
frame = st.binary(max_size=80) | packed | packed_meta | headers
random_frames = st.lists(frame, max_size=6)
valid = st.sampled_from(sorted(EXAMPLES)).map(lambda name: list(EXAMPLES[name]))


def _structured(raw: bytes) -> Any:
    """The msgpack map or list in a frame, or None."""
    try:
        value = msgpack.unpackb(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict | list) else None


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path] + [sub for key, child in children for sub in _paths(child, (*path, key))]


@st.composite
def changed_field(draw: st.DrawFn, structure: Any) -> bytes:
    """A valid meta or payload with one value somewhere in its nesting replaced, removed or added."""
    path = draw(st.sampled_from(_paths(structure)))
    if not path:
        return _packb(draw(values))
    parent = structure
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(("replace", "delete", "add")))
    if action == "replace":
        parent[path[-1]] = draw(field_values)
    elif action == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.sampled_from(META_KEYS) | st.text(max_size=12))] = draw(field_values)
    else:
        parent.append(draw(field_values))
    return _packb(structure)


@st.composite
def mutated(draw: st.DrawFn) -> list[bytes]:
    """A valid message broken by one to four mutations."""
    frames = draw(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("flip", "truncate", "duplicate", "swap", "drop", "insert", "meta",
                                     "field", "field", "command", "id")))
        at = draw(st.integers(0, max(0, len(frames) - 1)))
        structured = {i: value for i, raw in enumerate(frames) if (value := _structured(raw)) is not None}
        if kind == "insert" or not frames:
            frames.insert(draw(st.integers(0, len(frames))), draw(frame))
        elif kind == "field" and structured:
            at = draw(st.sampled_from(sorted(structured)))
            frames[at] = draw(changed_field(structured[at]))
        elif kind == "flip" and frames[at]:
            raw = bytearray(frames[at])
            raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
            frames[at] = bytes(raw)
        elif kind == "truncate":
            frames[at] = frames[at][: draw(st.integers(0, len(frames[at])))]
        elif kind == "duplicate":
            frames.insert(at, frames[at])
        elif kind == "swap":
            other = draw(st.integers(0, len(frames) - 1))
            frames[at], frames[other] = frames[other], frames[at]
        elif kind == "drop":
            del frames[at]
        elif kind == "meta":
            frames[min(len(frames) - 1, draw(st.integers(1, 2)))] = draw(packed_meta)
        elif kind == "command":
            frames[0] = b"ZB\x01" + bytes([draw(st.integers(0, 255))])
        elif kind == "id" and len(frames) > 1:
            frames[1] = draw(st.binary(max_size=70))
    return frames


messages = mutated() | mutated() | random_frames | valid


ENCODERS: dict[type, Callable[[Any], list[bytes]]] = {
    Request: wire.encode_request,
    Reply: wire.encode_reply,
    Ready: wire.encode_ready,
    Heartbeat: wire.encode_heartbeat,
    Disconnect: lambda message: wire.encode_disconnect(message.reason),
    Drain: lambda message: wire.encode_drain(),
    Cancel: lambda message: wire.encode_cancel(message.request_id),
    StatsQuery: lambda message: wire.encode_stats_query(message.request_id),
    GroupedReplies: lambda message: [wire.HEADERS[Command.REPLIES], *(
        frame for reply, meta in zip(message.replies, message.metas, strict=True)
        for frame in (reply.request_id, meta, reply.payload))],
}


MAX_COMPLAINT_CHARS = 300  # an error text goes back to the sender and into the log: never the input itself


def _only_protocol_errors(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ProtocolError as exc:
        assert len(str(exc)) <= MAX_COMPLAINT_CHARS, str(exc)[:1000]
        return None


@FUZZ
@given(messages)
def test_decoders_raise_only_protocol_errors_and_accept_only_what_they_can_encode(frames: list[bytes]) -> None:
    for decode in DECODERS:
        message = _only_protocol_errors(functools.partial(decode, list(frames)))
        if message is not None and not isinstance(message, Command):
            assert decode(ENCODERS[type(message)](message)) == message
    for payload in frames:
        _only_protocol_errors(functools.partial(payloads.decode_payload, payload))


@FUZZ_PAYLOAD
@given(packed)
def test_payload_decoder_raises_only_protocol_errors(payload: bytes) -> None:
    _only_protocol_errors(functools.partial(payloads.decode_payload, payload))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


MODEL = "m"
CONFIG = CoreSettings(models=(MODEL,), max_backlog=16, timeout_ms=1000, max_timeout_ms=2000,
                      no_worker_grace_ms=500, max_message_bytes=4096)
GOOD_WORKER = b"W-good"
traffic = st.lists(st.tuples(st.sampled_from((Peer.CLIENT, Peer.WORKER)), st.sampled_from((b"A", b"B", b"W")),
                             messages, st.booleans()), max_size=12)


def _answer_held_jobs(core: BrokerCore, sent: list[tuple[Peer, bytes, list[bytes]]]) -> None:
    """The well-behaved worker answers every request the broker sent it."""
    for peer, identity, frames in sent:
        if peer is Peer.WORKER and identity == GOOD_WORKER and frames[0] == wire.HEADERS[Command.REQUEST]:
            core.worker_message(GOOD_WORKER, wire.encode_reply(Reply(frames[1], Status.OK, "", b"out")))


@FUZZ_TRAFFIC
@given(traffic)
def test_core_survives_hostile_traffic_and_answers_each_request_once(
    messages_in: list[tuple[Peer, bytes, list[bytes], bool]],
) -> None:
    clock = FakeClock()
    core = BrokerCore(CONFIG, clock)
    core.worker_message(GOOD_WORKER, wire.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4),), 8)))
    expected: Counter[tuple[bytes, bytes]] = Counter()
    heartbeats: Counter[bytes] = Counter()  # a client's HEARTBEAT is answered with one
    sent: list[tuple[Peer, bytes, list[bytes]]] = []
    for number, (peer, identity, frames, answer) in enumerate(messages_in):
        frames = list(frames)
        if peer is Peer.WORKER:
            core.worker_message(identity, frames)
        elif frames == [wire.HEADERS[Command.HEARTBEAT]]:
            heartbeats[identity] += 1
            core.client_message(identity, frames)
        elif wire.request_id_of(frames) is not None:
            # Ids are made unique per message, so each answer can be matched to its message.
            frames[1] = b"id-%d" % number
            expected[(identity, frames[1])] += expected_replies(frames)
            core.client_message(identity, frames)
        else:
            core.client_message(identity, frames)
        clock.now += 0.01
        core.tick()
        if answer:
            _answer_held_jobs(core, core.outbox)
        sent += core.outbox
        core.outbox = []
    clock.now += CONFIG.max_timeout_ms / 1000 + 1
    core.tick()
    core.tick()
    answered: Counter[tuple[bytes, bytes]] = Counter()
    answered_heartbeats: Counter[bytes] = Counter()
    for peer, identity, frames in sent + core.outbox:
        if peer is Peer.CLIENT and frames == [wire.HEADERS[Command.HEARTBEAT]]:
            answered_heartbeats[identity] += 1
        elif peer is Peer.CLIENT:
            assert frames[0] == wire.HEADERS[Command.REPLY]
            answered[(identity, wire.decode_reply(frames).request_id)] += 1
    assert answered == +expected
    assert answered_heartbeats == heartbeats
    assert core.idle


def test_oversized_client_message_is_refused_before_decoding() -> None:
    core = BrokerCore(CONFIG, FakeClock())
    meta = msgpack.packb({"model": MODEL, "items": 1})
    core.client_message(b"A", [wire.HEADERS[Command.REQUEST], b"r1", meta, b"\xc1" * 5000])
    [(peer, identity, frames)] = core.outbox
    reply = wire.decode_reply(frames)
    assert (peer, identity, reply.request_id, reply.status) == (Peer.CLIENT, b"A", b"r1", "bad_request")
    assert "message too large" in reply.message and "4096" in reply.message
    assert not core.jobs


def _meta(**fields: Any) -> bytes:
    return _packb(fields)


def _array(dtype: Any, shape: Any, data: Any) -> bytes:
    return _packb({"outputs": [msgpack.ExtType(1, _packb([dtype, shape, data]))]})


REQUEST, READY, HEARTBEAT, REPLY = (wire.HEADERS[c] for c in (Command.REQUEST, Command.READY,
                                                                    Command.HEARTBEAT, Command.REPLY))
MODELS = [{"name": "m", "task": "t", "max_batch_size": 1}]


@pytest.mark.parametrize(("frames", "complaint"), [
    ([REQUEST, b"id", _meta(model=b"m", items=1), b""], "not valid msgpack"),  # no binary in meta
    ([REQUEST, b"id", _meta(model=msgpack.ExtType(5, b""), items=1), b""], "no msgpack extension"),
    ([REQUEST, b"id", _meta(model="m", items=1, trace=["x"] * 1025), b""], "not valid msgpack"),
    ([REQUEST, b"id", _meta(model="m\nINFO forged log line", items=1), b""], "printable"),
    ([READY, _meta(models=MODELS * 1025, capacity=1)], "not valid msgpack"),
    ([READY, _meta(models=[{"name": "m", "task": "\x1b[2J", "max_batch_size": 1}], capacity=1)], "task"),
    ([READY, _meta(models=MODELS, capacity=1, pid=-1)], "pid"),
    ([READY, _meta(models=MODELS, capacity=1, host="h" * 257)], "'host'"),
    ([HEARTBEAT, _meta(batches={"m": {"batches": -1}})], "negative"),
    ([HEARTBEAT, _meta(batches={"m\x00": {"batches": 1}})], "printable"),
    ([REPLY, b"id", _meta(status="overloaded", retry_after_ms=-5), b""], "retry_after_ms"),
])
def test_schema_rejects(frames: list[bytes], complaint: str) -> None:
    with pytest.raises(ProtocolError) as info:
        (wire.decode_client_message if frames[0] == REQUEST else wire.decode_worker_message)(frames)
    assert complaint in str(info.value)


@pytest.mark.parametrize(("payload", "complaint"), [
    (_array("<U4", [1], b"\x00" * 16), "not a little-endian number type"),
    (_array("a", [1], b"\x00"), "not a little-endian number type"),
    (_array("<f4", [2**32, 2**32], b""), "does not match"),  # wraps to 0 in int64 arithmetic
    (_array("<f4", [2**64 - 1], b""), "does not match"),
    (_array("<f4", [1] * 33, b"\x00" * 4), "malformed ndarray"),
    (_array("<f4", [1], "four"), "does not match"),
    (_packb({"outputs": [msgpack.ExtType(1, _packb(7))]}), "[dtype, shape, data]"),
])
def test_payload_arrays_are_checked_before_numpy_sees_them(payload: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError) as info:
        payloads.decode_payload(payload)
    assert complaint in str(info.value)


@pytest.mark.parametrize("frames", [
    [REQUEST, b"id", _meta(model="m", items=1, **{f"{i:04d}" + "k" * 56: 0 for i in range(1000)}), b""],
    [REPLY, b"id", _meta(status="s" * 60_000), b""],
    [READY, _meta(models=[{"name": "m", "task": "t", "max_batch_size": 1, "x" * 60_000: 1}], capacity=1)],
])
def test_complaints_stay_short_whatever_the_input(frames: list[bytes]) -> None:
    """The text goes back to the sender and into the broker's log: it must not echo a 64 KiB input."""
    with pytest.raises(ProtocolError) as info:
        (wire.decode_worker_message if frames[0] == READY else wire.decode_client_message
         if frames[0] == REQUEST else wire.decode_reply)(frames)
    assert len(str(info.value)) <= MAX_COMPLAINT_CHARS


def test_payload_limits_follow_max_bytes() -> None:
    assert payloads.decode_payload(_packb({"inputs": ["x" * 100]}), max_bytes=200) == {"inputs": ["x" * 100]}
    with pytest.raises(ProtocolError, match="larger than 50 bytes"):
        payloads.decode_payload(_packb({"inputs": ["x" * 100]}), max_bytes=50)
