"""Hostile input, generated: no decoder raises anything but ProtocolError, and the broker core
never crashes and answers every request it can address exactly once.

The examples start from the valid messages of PROTOCOL.md section 9 and break them (flipped
bytes, truncated, duplicated, swapped, dropped or foreign frames, random meta maps), next to
plain random frame lists.  The profile is fixed (derandomized, no example database), so a run
is repeatable and takes seconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import protocol
from broker.config import BrokerConfig
from broker.core import BrokerCore, Peer
from broker.protocol import Cancel, Command, ModelInfo, ProtocolError, Ready
from tests.broker.protocol_examples import EXAMPLES

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=3000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DECODERS: tuple[Callable[[list[bytes]], Any], ...] = (
    protocol.decode_client_message,
    protocol.decode_worker_message,
    protocol.decode_broker_to_worker,
    protocol.decode_reply,
    protocol.decode_header,
)
META_KEYS = ("model", "items", "timeout_ms", "priority", "trace", "status", "message", "retry_after_ms",
             "models", "capacity", "name", "host", "pid", "device", "batches", "reason", "task",
             "max_batch_size", "cancelled", "expired")
DTYPES = ("<f4", "<f8", "|u1", "|b1", "<i8", "<f2", ">f4", "<U4", "|O", "V8", "f4,f4", "(2,)<f4", "a", "",
          "S0", "<M8[s]", "<c8")

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=40) | st.binary(max_size=40))


def _ext(children: st.SearchStrategy[Any]) -> st.SearchStrategy[msgpack.ExtType]:
    """Extension values, mostly type 1 with arrays that may lie about dtype, shape or length."""
    shape = st.lists(st.integers(-2, 2**64 - 1) | st.sampled_from([0, 1, 2, 3, 4, 2**32, 2**62]), max_size=70)
    body = st.tuples(st.sampled_from(DTYPES) | children, shape | children, st.binary(max_size=64) | children)
    ndarray = body.map(lambda parts: msgpack.ExtType(1, msgpack.packb(list(parts), use_bin_type=True)))
    return ndarray | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=32))


values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
                      | _ext(children)),
    max_leaves=24,
)
meta_maps = st.dictionaries(st.sampled_from(META_KEYS) | st.text(max_size=12), values, max_size=8)
packed = values.map(lambda value: msgpack.packb(value, use_bin_type=True))
packed_meta = meta_maps.map(lambda meta: msgpack.packb(meta, use_bin_type=True))
headers = st.sampled_from(list(protocol.HEADERS.values())) | st.binary(min_size=4, max_size=4).map(
    lambda raw: b"ZB" + raw[2:])
frame = st.binary(max_size=80) | packed | packed_meta | headers
random_frames = st.lists(frame, max_size=6)
valid = st.sampled_from(sorted(EXAMPLES)).map(lambda name: list(EXAMPLES[name]))


@st.composite
def mutated(draw: st.DrawFn) -> list[bytes]:
    """A valid message broken by one to four mutations."""
    frames = draw(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("flip", "truncate", "duplicate", "swap", "drop", "insert", "meta",
                                     "command", "id")))
        at = draw(st.integers(0, max(0, len(frames) - 1)))
        if kind == "insert" or not frames:
            frames.insert(draw(st.integers(0, len(frames))), draw(frame))
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


messages = mutated() | random_frames | valid


def _only_protocol_errors(call: Callable[[], Any]) -> None:
    try:
        call()
    except ProtocolError:
        pass


@FUZZ
@given(messages)
def test_decoders_raise_only_protocol_errors(frames: list[bytes]) -> None:
    for decode in DECODERS:
        _only_protocol_errors(lambda: decode(list(frames)))
    for payload in frames:
        _only_protocol_errors(lambda: protocol.decode_payload(payload))


@FUZZ
@given(packed)
def test_payload_decoder_raises_only_protocol_errors(payload: bytes) -> None:
    try:
        decoded = protocol.decode_payload(payload)
    except ProtocolError:
        return
    assert protocol.decode_payload(protocol.encode_payload(decoded)) is not None or decoded is None


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


MODEL = "m"
CONFIG = BrokerConfig(models=(MODEL,), max_backlog=16, timeout_ms=1000, max_timeout_ms=2000,
                      no_worker_grace_ms=500)
GOOD_WORKER = b"W-good"
traffic = st.lists(st.tuples(st.sampled_from((Peer.CLIENT, Peer.WORKER)), st.sampled_from((b"A", b"B", b"W")),
                             messages), max_size=12)


def _expected_replies(frames: list[bytes]) -> int:
    """Each client message that carries a usable id is answered once, except a valid CANCEL."""
    if protocol.request_id_of(frames) is None:
        return 0
    try:
        return 0 if isinstance(protocol.decode_client_message(frames), Cancel) else 1
    except ProtocolError:
        return 1


@FUZZ
@given(traffic)
def test_core_survives_hostile_traffic_and_answers_each_request_once(
    messages_in: list[tuple[Peer, bytes, list[bytes]]],
) -> None:
    clock = FakeClock()
    core = BrokerCore(CONFIG, clock)
    core.worker_message(GOOD_WORKER, protocol.encode_ready(Ready((ModelInfo(MODEL, "embeddings", 4),), 8)))
    expected: Counter[tuple[bytes, bytes]] = Counter()
    for number, (peer, identity, frames) in enumerate(messages_in):
        frames = list(frames)
        if peer is Peer.WORKER:
            core.worker_message(identity, frames)
        else:
            # Ids are made unique per message, so each answer can be matched to its message.
            if protocol.request_id_of(frames) is not None:
                frames[1] = b"id-%d" % number
                expected[(identity, frames[1])] += _expected_replies(frames)
            core.client_message(identity, frames)
        clock.now += 0.01
        core.tick()
    clock.now += CONFIG.max_timeout_ms / 1000 + 1
    core.tick()
    core.tick()
    answered: Counter[tuple[bytes, bytes]] = Counter()
    for peer, identity, frames in core.outbox:
        if peer is Peer.CLIENT:
            assert frames[0] == protocol.HEADERS[Command.REPLY]
            answered[(identity, protocol.decode_reply(frames).request_id)] += 1
    assert answered == +expected
    assert core.idle


def test_oversized_client_message_is_refused_before_decoding() -> None:
    core = BrokerCore(CONFIG, FakeClock())
    meta = msgpack.packb({"model": MODEL, "items": 1})
    core.client_message(b"A", [protocol.HEADERS[Command.REQUEST], b"r1", meta, b"\xc1" * 5000])
    [(peer, identity, frames)] = core.outbox
    reply = protocol.decode_reply(frames)
    assert (peer, identity, reply.request_id, reply.status) == (Peer.CLIENT, b"A", b"r1", "bad_request")
    assert "message too large" in reply.message and "4096" in reply.message
    assert not core.jobs
