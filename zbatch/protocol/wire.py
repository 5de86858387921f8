"""zbatch wire protocol v1: every message encoded and decoded, with no sockets.

Theory of operation
-------------------
Three kinds of peer speak this protocol, over ZeroMQ multipart messages:

* a *client* (the HTTP gateway, or anyone with a DEALER socket) connects to the
  broker's frontend ROUTER;
* a *worker* connects a DEALER socket to the broker's backend ROUTER;
* the *broker* sits between them and owns the scheduling.

Every message starts with a 4-byte header frame: ``b"ZB"``, the protocol
version (1) and a command byte.  The frames after it depend on the command
(see ``zbatch/protocol/PROTOCOL.md``, which is the normative description; this module
is its implementation).  Small structured fields travel as msgpack maps in a
"meta" frame; model inputs and outputs travel in a separate "payload" frame
that the broker never decodes: it only reads the request id, the model name,
the item count and the timeout, and forwards the payload frame as it came.

The messages themselves, their commands, statuses and limits, are plain data
in :mod:`zbatch.protocol.messages`; this module re-exports them, so callers
import a message and its codec from one place.

Decoding is strict: anything that does not match the schema raises
:class:`ProtocolError`, the only exception the decoders raise, so callers can
answer "bad request" or drop the message without ever crashing.

The payload codec (numpy arrays as raw little-endian bytes) is
:mod:`zbatch.protocol.payloads`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Set as AbstractSet
from typing import Any

import msgpack

from zbatch.protocol.messages import (
    COMMANDS as COMMANDS,
)
from zbatch.protocol.messages import (
    COUNTER_KEYS as COUNTER_KEYS,
)
from zbatch.protocol.messages import (
    HEADERS as HEADERS,
)
from zbatch.protocol.messages import (
    HIGH_PRIORITY as HIGH_PRIORITY,
)
from zbatch.protocol.messages import (
    LOW_PRIORITY as LOW_PRIORITY,
)
from zbatch.protocol.messages import (
    MAX_BATCH_TOKENS as MAX_BATCH_TOKENS,
)
from zbatch.protocol.messages import (
    MAX_CAPACITY as MAX_CAPACITY,
)
from zbatch.protocol.messages import (
    MAX_COUNTER as MAX_COUNTER,
)
from zbatch.protocol.messages import (
    MAX_DIMENSIONS as MAX_DIMENSIONS,
)
from zbatch.protocol.messages import (
    MAX_DTYPE_CHARS as MAX_DTYPE_CHARS,
)
from zbatch.protocol.messages import (
    MAX_GROUPED_BYTES as MAX_GROUPED_BYTES,
)
from zbatch.protocol.messages import (
    MAX_GROUPED_REPLIES as MAX_GROUPED_REPLIES,
)
from zbatch.protocol.messages import (
    MAX_ID_BYTES as MAX_ID_BYTES,
)
from zbatch.protocol.messages import (
    MAX_LABEL_CHARS as MAX_LABEL_CHARS,
)
from zbatch.protocol.messages import (
    MAX_LABELS as MAX_LABELS,
)
from zbatch.protocol.messages import (
    MAX_META_BYTES as MAX_META_BYTES,
)
from zbatch.protocol.messages import (
    MAX_META_ITEMS as MAX_META_ITEMS,
)
from zbatch.protocol.messages import (
    MAX_MODEL_LENGTH as MAX_MODEL_LENGTH,
)
from zbatch.protocol.messages import (
    MAX_MODELS_PER_WORKER as MAX_MODELS_PER_WORKER,
)
from zbatch.protocol.messages import (
    MAX_NAME_CHARS as MAX_NAME_CHARS,
)
from zbatch.protocol.messages import (
    MAX_NAMED_FIELDS as MAX_NAMED_FIELDS,
)
from zbatch.protocol.messages import (
    MAX_PID as MAX_PID,
)
from zbatch.protocol.messages import (
    MAX_RETRY_AFTER_MS as MAX_RETRY_AFTER_MS,
)
from zbatch.protocol.messages import (
    MAX_SHOWN_CHARS as MAX_SHOWN_CHARS,
)
from zbatch.protocol.messages import (
    MAX_TEXT_CHARS as MAX_TEXT_CHARS,
)
from zbatch.protocol.messages import (
    MAX_TRACE_CHARS as MAX_TRACE_CHARS,
)
from zbatch.protocol.messages import (
    MODEL_INFO_KEYS as MODEL_INFO_KEYS,
)
from zbatch.protocol.messages import (
    NORMAL_PRIORITY as NORMAL_PRIORITY,
)
from zbatch.protocol.messages import (
    REPLY_KEYS as REPLY_KEYS,
)
from zbatch.protocol.messages import (
    REQUEST_KEYS as REQUEST_KEYS,
)
from zbatch.protocol.messages import (
    SIGNATURE as SIGNATURE,
)
from zbatch.protocol.messages import (
    STATUSES as STATUSES,
)
from zbatch.protocol.messages import (
    TOKENIZER_FINGERPRINT as TOKENIZER_FINGERPRINT,
)
from zbatch.protocol.messages import (
    VERSION as VERSION,
)
from zbatch.protocol.messages import (
    BatchCounters as BatchCounters,
)
from zbatch.protocol.messages import (
    BrokerToWorkerMessage as BrokerToWorkerMessage,
)
from zbatch.protocol.messages import (
    Cancel as Cancel,
)
from zbatch.protocol.messages import (
    ClientMessage as ClientMessage,
)
from zbatch.protocol.messages import (
    Command as Command,
)
from zbatch.protocol.messages import (
    Disconnect as Disconnect,
)
from zbatch.protocol.messages import (
    Drain as Drain,
)
from zbatch.protocol.messages import (
    GroupedReplies as GroupedReplies,
)
from zbatch.protocol.messages import (
    Heartbeat as Heartbeat,
)
from zbatch.protocol.messages import (
    ModelInfo as ModelInfo,
)
from zbatch.protocol.messages import (
    ProtocolError as ProtocolError,
)
from zbatch.protocol.messages import (
    Ready as Ready,
)
from zbatch.protocol.messages import (
    Reply as Reply,
)
from zbatch.protocol.messages import (
    Request as Request,
)
from zbatch.protocol.messages import (
    StatsQuery as StatsQuery,
)
from zbatch.protocol.messages import (
    Status as Status,
)
from zbatch.protocol.messages import (
    WorkerMessage as WorkerMessage,
)

# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------


class ReusedPacker:
    """A msgpack packer per thread, made once and reused.

    ``msgpack.packb`` makes a packer each call, and each packer a 256 KiB buffer, which glibc maps and unmaps
    for every message: a broker serving HTTP traffic spent an ``mmap`` and a ``munmap`` a request on it.
    """

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._local = threading.local()

    def pack(self, value: Any) -> bytes:
        packer = getattr(self._local, "packer", None)
        if packer is None:
            packer = self._local.packer = msgpack.Packer(**self._options)
        try:
            packed: bytes = packer.pack(value)
        except BaseException:
            packer.reset()  # a failed pack leaves what it wrote so far in the buffer
            raise
        return packed


_META_PACKER = ReusedPacker(use_bin_type=True)


def pack(value: Any) -> bytes:
    """msgpack as every meta frame is written (binary stays binary)."""
    return _META_PACKER.pack(value)


def encode_request(request: Request) -> list[bytes]:
    meta: dict[str, Any] = {"model": request.model, "items": request.items}
    if request.timeout_ms is not None:
        meta["timeout_ms"] = request.timeout_ms
    if request.priority != NORMAL_PRIORITY:
        meta["priority"] = request.priority
    if request.trace:
        meta["trace"] = request.trace
    if request.grouped:
        meta["grouped"] = True
    return [HEADERS[Command.REQUEST], request.request_id, pack(meta), request.payload]


def encode_reply(reply: Reply) -> list[bytes]:
    return [HEADERS[Command.REPLY], reply.request_id, _reply_meta(reply), reply.payload]


def _reply_meta(reply: Reply) -> bytes:
    meta: dict[str, Any] = {"status": reply.status.value, "message": reply.message}
    if reply.retry_after_ms is not None:
        meta["retry_after_ms"] = reply.retry_after_ms
    return pack(meta)


def encode_grouped(replies: list[Reply]) -> list[list[bytes]]:
    """Answers to requests sent ``grouped``, as few messages as the limits allow (PROTOCOL.md 3.10)."""
    if len(replies) == 1:  # the usual case at low load, without the grouping's lists
        return [encode_reply(replies[0])]
    return group_answers([(reply.request_id, _reply_meta(reply), reply.payload) for reply in replies])


def group_answers(answers: list[tuple[bytes, bytes, bytes]]) -> list[list[bytes]]:
    """(request id, meta frame, payload) answers as REPLIES messages of at most ``MAX_GROUPED_REPLIES`` answers,
    each started anew past ``MAX_GROUPED_BYTES`` of payload; an answer alone goes as a plain REPLY."""
    messages: list[list[bytes]] = []
    frames: list[bytes] = []
    size = 0
    for request_id, meta, payload in answers:
        if frames and (len(frames) >= 3 * MAX_GROUPED_REPLIES or size + len(payload) > MAX_GROUPED_BYTES):
            messages.append(_grouped_message(frames))
            frames, size = [], 0
        frames += (request_id, meta, payload)
        size += len(payload)
    if frames:
        messages.append(_grouped_message(frames))
    return messages


def _grouped_message(frames: list[bytes]) -> list[bytes]:
    command = Command.REPLY if len(frames) == 3 else Command.REPLIES
    return [HEADERS[command], *frames]


def encode_ready(ready: Ready) -> list[bytes]:
    meta: dict[str, Any] = {
        "models": [{"name": m.name, **m.details()} for m in ready.models],
        "capacity": ready.capacity,
        "name": ready.name,
        "host": ready.host,
        "pid": ready.pid,
        "device": ready.device,
    }
    if ready.grouped:
        meta["grouped"] = True
    return [HEADERS[Command.READY], pack(meta)]


def encode_heartbeat(heartbeat: Heartbeat | None = None) -> list[bytes]:
    if heartbeat is None or (not heartbeat.batches and heartbeat.capacity is None):
        return [HEADERS[Command.HEARTBEAT]]
    meta: dict[str, Any] = {}
    if heartbeat.batches:
        meta["batches"] = {name: counters_meta(c) for name, c in heartbeat.batches.items()}
    if heartbeat.capacity is not None:
        meta["capacity"] = heartbeat.capacity
    return [HEADERS[Command.HEARTBEAT], pack(meta)]


def counters_meta(counters: BatchCounters) -> dict[str, int]:
    """A heartbeat's counters of one model; ``busy_ms`` is left out while 0, as a worker that does not measure it
    sends them (PROTOCOL.md 3.7)."""
    meta = dataclasses.asdict(counters)
    if not counters.busy_ms:
        del meta["busy_ms"]
    return meta


def encode_disconnect(reason: str = "") -> list[bytes]:
    return [HEADERS[Command.DISCONNECT], pack({"reason": reason})]


def encode_drain() -> list[bytes]:
    return [HEADERS[Command.DRAIN]]


def encode_cancel(request_id: bytes) -> list[bytes]:
    return [HEADERS[Command.CANCEL], request_id]


def encode_stats_query(request_id: bytes) -> list[bytes]:
    return [HEADERS[Command.STATS], request_id]


def readdressed_reply(request_id: bytes, meta: bytes, payload: bytes) -> list[bytes]:
    """A worker's answer under the client's request id: the broker forwards meta and payload untouched."""
    return [HEADERS[Command.REPLY], request_id, meta, payload]


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------


def decode_header(frames: list[bytes]) -> Command:
    """The command of a message, after checking signature and version."""
    if not frames:
        raise ProtocolError("empty message")
    header = frames[0]
    if len(header) != 4 or header[:2] != SIGNATURE:
        raise ProtocolError("first frame is not a zbatch header (expected b'ZB' + version + command)")
    if header[2] != VERSION:
        raise ProtocolError(f"protocol version {header[2]} is not supported; this peer speaks {VERSION}")
    command = COMMANDS.get(header[3])
    if command is None:
        raise ProtocolError(f"unknown command {header[3]}")
    return command


def decode_client_message(frames: list[bytes]) -> ClientMessage:
    """A message a client may send to the broker's frontend."""
    command = decode_header(frames)
    if command is Command.REQUEST:
        return _decode_request(frames)
    if command is Command.CANCEL:
        return Cancel(_decode_id_only(frames))
    if command is Command.STATS:
        return StatsQuery(_decode_id_only(frames))
    if command is Command.HEARTBEAT:
        _expect_frames(frames, 1, 1)
        return Heartbeat()
    raise ProtocolError(f"command {command.name} is not allowed from a client")


def decode_worker_message(frames: list[bytes]) -> WorkerMessage:
    """A message a worker may send to the broker's backend."""
    command = decode_header(frames)
    if command is Command.READY:
        return _decode_ready(frames)
    if command is Command.REPLY:
        return decode_reply(frames)
    if command is Command.REPLIES:
        return _decode_grouped(frames)
    if command is Command.HEARTBEAT:
        return _decode_heartbeat(frames)
    if command is Command.DISCONNECT:
        return _decode_disconnect(frames)
    if command is Command.DRAIN:
        _expect_frames(frames, 1, 1)
        return Drain()
    raise ProtocolError(f"command {command.name} is not allowed from a worker")


def decode_broker_to_worker(frames: list[bytes]) -> BrokerToWorkerMessage:
    """A message the broker may send to a worker."""
    command = decode_header(frames)
    if command is Command.REQUEST:
        return _decode_request(frames)
    if command is Command.CANCEL:
        return Cancel(_decode_id_only(frames))
    if command is Command.HEARTBEAT:
        _expect_frames(frames, 1, 1)
        return Heartbeat()
    if command is Command.DISCONNECT:
        return _decode_disconnect(frames)
    if command is Command.DRAIN:
        _expect_frames(frames, 1, 1)
        return Drain()
    raise ProtocolError(f"command {command.name} is not allowed from the broker to a worker")


def decode_reply(frames: list[bytes]) -> Reply:
    if decode_header(frames) is not Command.REPLY:
        raise ProtocolError("expected a REPLY")
    _expect_frames(frames, 4, 4)
    return _reply_of(frames[1], frames[2], frames[3])


def split_grouped(frames: list[bytes]) -> list[list[bytes]]:
    """A REPLIES message as the REPLY messages it groups, each to be decoded on its own (``decode_reply``),
    so that one answer a receiver cannot read spoils no other."""
    if decode_header(frames) is not Command.REPLIES:
        raise ProtocolError("expected a REPLIES")
    answers, extra = divmod(len(frames) - 1, 3)
    if extra or not 1 <= answers <= MAX_GROUPED_REPLIES:
        raise ProtocolError(f"REPLIES holds 1 to {MAX_GROUPED_REPLIES} answers of 3 frames each after its header, "
                            f"got {len(frames) - 1} frames")
    reply = HEADERS[Command.REPLY]
    return [[reply, frames[index], frames[index + 1], frames[index + 2]] for index in range(1, len(frames), 3)]


def _decode_grouped(frames: list[bytes]) -> GroupedReplies:
    """REPLIES from a worker, whole: one answer that does not follow the protocol makes the message malformed."""
    answers = split_grouped(frames)
    return GroupedReplies(tuple(_reply_of(answer[1], answer[2], answer[3]) for answer in answers),
                          tuple(answer[2] for answer in answers))


def _reply_of(id_frame: bytes, meta_frame: bytes, payload: bytes) -> Reply:
    request_id = _check_id(id_frame)
    meta = _unpack_meta(meta_frame)
    _only_keys(meta, REPLY_KEYS)
    raw_status = _field(meta, "status", str)
    status = STATUSES.get(raw_status)
    if status is None:
        raise ProtocolError(f"unknown status {shortened(repr(raw_status))}")
    retry_after = _optional(meta, "retry_after_ms", int)
    if retry_after is not None and not 0 <= retry_after <= MAX_RETRY_AFTER_MS:
        raise ProtocolError(f"retry_after_ms must be 0 to {MAX_RETRY_AFTER_MS}")
    return Reply(
        request_id=request_id,
        status=status,
        message=_optional(meta, "message", str) or "",
        payload=payload,
        retry_after_ms=retry_after,
    )


def request_id_of(frames: list[bytes]) -> bytes | None:
    """Best-effort request id of a malformed client message, so it can still be answered."""
    if len(frames) >= 2 and 1 <= len(frames[1]) <= MAX_ID_BYTES:
        return frames[1]
    return None


def _decode_request(frames: list[bytes]) -> Request:
    _expect_frames(frames, 4, 4)
    request_id = _check_id(frames[1])
    meta = _unpack_meta(frames[2])
    _only_keys(meta, REQUEST_KEYS)
    model = _check_name(_field(meta, "model", str), "model name")
    items = _field(meta, "items", int)
    if items < 1:
        raise ProtocolError("items must be at least 1")
    timeout_ms = _optional(meta, "timeout_ms", int)
    if timeout_ms is not None and timeout_ms < 1:
        raise ProtocolError("timeout_ms must be at least 1")
    priority = _optional(meta, "priority", int)
    if priority is not None and not HIGH_PRIORITY <= priority <= LOW_PRIORITY:
        raise ProtocolError(f"priority must be {HIGH_PRIORITY} (high) to {LOW_PRIORITY} (low)")
    trace = _optional(meta, "trace", str) or ""
    if len(trace) > MAX_TRACE_CHARS or not trace.isprintable():
        raise ProtocolError(f"trace must be printable and at most {MAX_TRACE_CHARS} characters")
    grouped: bool = _optional(meta, "grouped", bool) or False
    return Request(request_id, model, items, frames[3], timeout_ms,
                   NORMAL_PRIORITY if priority is None else priority, trace, grouped)


def _decode_ready(frames: list[bytes]) -> Ready:
    _expect_frames(frames, 2, 2)
    meta = _unpack_meta(frames[1])
    _only_keys(meta, {"models", "capacity", "name", "host", "pid", "device", "grouped"})
    raw_models = _field(meta, "models", list)
    if not 1 <= len(raw_models) <= MAX_MODELS_PER_WORKER:
        raise ProtocolError(f"READY must list at least one model and at most {MAX_MODELS_PER_WORKER}")
    models = tuple(_decode_model_info(m) for m in raw_models)
    if len({m.name for m in models}) != len(models):
        raise ProtocolError("READY lists a model twice")
    capacity = _field(meta, "capacity", int)
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ProtocolError(f"capacity must be 1 to {MAX_CAPACITY}")
    pid = _optional(meta, "pid", int) or 0
    if not 0 <= pid <= MAX_PID:
        raise ProtocolError(f"pid must be 0 to {MAX_PID}")
    return Ready(
        models=models,
        capacity=capacity,
        name=_display_text(meta, "name"),
        host=_display_text(meta, "host"),
        pid=pid,
        device=_display_text(meta, "device"),
        grouped=_optional(meta, "grouped", bool) or False,
    )


def _decode_model_info(raw: Any) -> ModelInfo:
    if not isinstance(raw, dict):
        raise ProtocolError("each model in READY must be a map")
    _only_keys(raw, MODEL_INFO_KEYS)
    name = _check_name(_field(raw, "name", str), "model name")
    task = _check_name(_field(raw, "task", str), "task")
    batch = _bounded(_field(raw, "max_batch_size", int), "max_batch_size", MAX_CAPACITY)
    max_length = _optional(raw, "max_length", int)
    dimensions = _optional(raw, "dimensions", int)
    dtype: str = _optional(raw, "dtype", str) or ""
    if dtype:
        _check_text(dtype, "dtype", MAX_DTYPE_CHARS)
    labels = _optional(raw, "labels", list) or []
    if len(labels) > MAX_LABELS:
        raise ProtocolError(f"a model has at most {MAX_LABELS} labels in READY")
    for label in labels:
        if not isinstance(label, str):
            raise ProtocolError("labels must be strings")
        _check_text(label, "a label", MAX_LABEL_CHARS)
    tokenizer: str = _optional(raw, "tokenizer", str) or ""
    if tokenizer and not TOKENIZER_FINGERPRINT.fullmatch(tokenizer):
        raise ProtocolError("tokenizer must be 16 lowercase hexadecimal digits")
    budget = _optional(raw, "max_batch_tokens", int)
    return ModelInfo(name, task, batch,
                     None if max_length is None else _bounded(max_length, "max_length", MAX_MODEL_LENGTH),
                     None if dimensions is None else _bounded(dimensions, "dimensions", MAX_DIMENSIONS),
                     dtype, tuple(labels), tokenizer,
                     None if budget is None else _bounded(budget, "max_batch_tokens", MAX_BATCH_TOKENS))


def _bounded(value: int, what: str, maximum: int) -> int:
    if not 1 <= value <= maximum:
        raise ProtocolError(f"{what} must be 1 to {maximum}")
    return value


def _check_text(value: str, what: str, maximum: int) -> None:
    if not 1 <= len(value) <= maximum or not value.isprintable():
        raise ProtocolError(f"{what} must have 1 to {maximum} printable characters")


def _decode_heartbeat(frames: list[bytes]) -> Heartbeat:
    _expect_frames(frames, 1, 2)
    if len(frames) == 1:
        return Heartbeat()
    meta = _unpack_meta(frames[1])
    _only_keys(meta, {"batches", "capacity"})
    capacity = _optional(meta, "capacity", int)
    if capacity is not None and not 0 <= capacity <= MAX_CAPACITY:
        raise ProtocolError(f"capacity must be 0 to {MAX_CAPACITY}")
    batches: dict[str, BatchCounters] = {}
    for name, counters in (_optional(meta, "batches", dict) or {}).items():
        if not isinstance(name, str) or not isinstance(counters, dict):
            raise ProtocolError("heartbeat batches must map model names to counter maps")
        _only_keys(counters, COUNTER_KEYS)
        values = {key: _field(counters, key, int) for key in counters}
        if any(value < 0 for value in values.values()):
            raise ProtocolError("heartbeat counters must not be negative")
        if any(value > MAX_COUNTER for value in values.values()):
            raise ProtocolError(f"heartbeat counters must be at most {MAX_COUNTER}")
        batches[_check_name(name, "model name")] = BatchCounters(**values)
    return Heartbeat(batches, capacity)


def _decode_disconnect(frames: list[bytes]) -> Disconnect:
    _expect_frames(frames, 1, 2)
    if len(frames) == 1:
        return Disconnect()
    meta = _unpack_meta(frames[1])
    _only_keys(meta, {"reason"})
    return Disconnect(_optional(meta, "reason", str) or "")


def _decode_id_only(frames: list[bytes]) -> bytes:
    _expect_frames(frames, 2, 2)
    return _check_id(frames[1])


def _expect_frames(frames: list[bytes], low: int, high: int) -> None:
    if not low <= len(frames) <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        raise ProtocolError(f"expected {expected} frames, got {len(frames)}")


def _check_name(value: str, what: str) -> str:
    """Names end up in logs, metrics labels and stats: short and printable, never control characters."""
    _check_text(value, what, MAX_NAME_CHARS)
    return value


def _display_text(meta: dict[Any, Any], key: str) -> str:
    value: str = _optional(meta, key, str) or ""
    if len(value) > MAX_TEXT_CHARS or not value.isprintable():
        raise ProtocolError(f"field {key!r} must be printable and at most {MAX_TEXT_CHARS} characters")
    return value


def _check_id(request_id: bytes) -> bytes:
    if not 1 <= len(request_id) <= MAX_ID_BYTES:
        raise ProtocolError(f"request id must be 1 to {MAX_ID_BYTES} bytes")
    return request_id


def _unpack_meta(frame: bytes) -> dict[Any, Any]:
    if len(frame) > MAX_META_BYTES:
        raise ProtocolError(f"meta frame larger than {MAX_META_BYTES} bytes")
    try:
        # Meta holds only strings, integers, lists and maps: binary and extension values are refused
        # while decoding, and the size limits are explicit rather than msgpack's buffer-sized defaults.
        meta = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, ext_hook=_no_extension,
            max_str_len=MAX_META_BYTES, max_bin_len=0, max_ext_len=0,
            max_array_len=MAX_META_ITEMS, max_map_len=MAX_META_ITEMS,
        )
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types on garbage; all mean the same
        raise ProtocolError(f"meta frame is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise ProtocolError("meta frame must be a msgpack map")
    return meta


def shortened(text: str) -> str:
    """A piece of the input for an error text: the text goes back to the sender and into logs, so it is short."""
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def _no_extension(code: int, data: bytes) -> Any:
    raise ProtocolError(f"meta frames hold no msgpack extension types (got type {code})")


def _only_keys(meta: dict[Any, Any], allowed: AbstractSet[str]) -> None:
    if meta.keys() <= allowed:  # the usual case, without building a set
        return
    unknown = set(meta) - allowed
    if unknown:
        named = ", ".join(shortened(key) for key in sorted(map(str, unknown))[:MAX_NAMED_FIELDS])
        more = f" and {len(unknown) - MAX_NAMED_FIELDS} more" if len(unknown) > MAX_NAMED_FIELDS else ""
        raise ProtocolError(f"unknown field(s): {named}{more}")


def _field(meta: dict[Any, Any], key: str, kind: type) -> Any:
    if key not in meta:
        raise ProtocolError(f"missing field {key!r}")
    return _typed(meta, key, kind)


def _optional(meta: dict[Any, Any], key: str, kind: type) -> Any:
    return _typed(meta, key, kind) if meta.get(key) is not None else None


def _typed(meta: dict[Any, Any], key: str, kind: type) -> Any:
    value = meta[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"field {key!r} must be of type {kind.__name__}")
    return value
