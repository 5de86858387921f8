"""zbatch wire protocol v1: the messages, their commands and statuses, and the protocol's limits.

Plain data, no codec and no sockets: :mod:`zbatch.protocol.wire` encodes and
decodes these messages (and re-exports them), following
``zbatch/protocol/PROTOCOL.md``, the normative description.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Final

SIGNATURE: Final = b"ZB"
VERSION: Final = 1
MAX_ID_BYTES: Final = 64
MAX_TRACE_CHARS: Final = 128
HIGH_PRIORITY, NORMAL_PRIORITY, LOW_PRIORITY = 0, 1, 2
MAX_NAME_CHARS: Final = 128
MAX_META_BYTES: Final = 64 * 1024
MAX_META_ITEMS: Final = 1024  # entries of any list or map in a meta frame (a worker's models, ...)
MAX_TEXT_CHARS: Final = 256  # a worker's name, host and device, for display
MAX_SHOWN_CHARS: Final = 40  # of an input quoted in an error text
MAX_NAMED_FIELDS: Final = 5
MAX_MODELS_PER_WORKER: Final = 64
MAX_CAPACITY: Final = 65_536  # items one worker may hold in flight
MAX_COUNTER: Final = 2**48  # a heartbeat's batch counters (years of work at a million items a second)
MAX_PID: Final = 2**32
MAX_RETRY_AFTER_MS: Final = 3_600_000
MAX_MODEL_LENGTH: Final = 2**24  # a model's most input tokens, as READY may announce it
MAX_DIMENSIONS: Final = 2**20  # an embedding's size, likewise
MAX_BATCH_TOKENS: Final = 2**31  # a model's token budget for one forward pass, likewise
MAX_DTYPE_CHARS: Final = 32
MAX_LABELS: Final = 256  # a classifier's labels in READY; a worker omits them beyond
MAX_LABEL_CHARS: Final = 128
MAX_GROUPED_REPLIES: Final = 1024  # answers in one REPLIES message (3.10)
MAX_GROUPED_BYTES: Final = 4 * 1024 * 1024  # a sender starts another REPLIES past this many payload bytes
TOKENIZER_FINGERPRINT: Final = re.compile(r"[0-9a-f]{16}")  # payloads.tokenizer_fingerprint's form
MODEL_INFO_KEYS: Final = frozenset({"name", "task", "max_batch_size", "max_length", "dimensions", "dtype", "labels",
                                    "tokenizer", "max_batch_tokens"})
# Array dtypes as numpy writes them for little-endian or single-byte numbers: "<f4", "|u1", ...


class ProtocolError(ValueError):
    """A message that does not follow the protocol; the text says which part."""


class Command(enum.IntEnum):
    READY = 1  # worker -> broker
    REQUEST = 2  # client -> broker, broker -> worker
    REPLY = 3  # broker -> client, worker -> broker
    HEARTBEAT = 4  # worker <-> broker, client <-> broker
    DISCONNECT = 5  # worker <-> broker
    CANCEL = 6  # client -> broker, broker -> worker
    STATS = 7  # client -> broker (answered with REPLY)
    DRAIN = 8  # worker -> broker: send no more work; broker -> worker: acknowledged
    REPLIES = 9  # broker -> client, worker -> broker: several REPLYs in one message, for a sender that allows it


class Status(enum.StrEnum):
    OK = "ok"
    BAD_REQUEST = "bad_request"
    UNKNOWN_MODEL = "unknown_model"
    OVERLOADED = "overloaded"
    NO_WORKER = "no_worker"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    WORKER_ERROR = "worker_error"
    WORKER_LOST = "worker_lost"
    CANCELLED = "cancelled"  # worker -> broker only: skipped because the broker sent CANCEL
    DECLINED = "declined"  # worker -> broker only: not taken, the worker is full (work from several brokers)


HEADERS: Final = {command: SIGNATURE + bytes((VERSION, command)) for command in Command}
# Lookups by value for the decoders: a dict is several times cheaper than calling the enum class.
COMMANDS: Final = {int(command): command for command in Command}
STATUSES: Final = {status.value: status for status in Status}


# --------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------


# Request and Reply are built for every message on the routing path; they are not frozen
# because a frozen dataclass's __init__ goes through object.__setattr__ per field, several
# times slower.  Treat them as values all the same: nothing modifies a message after it is made.
@dataclass(slots=True)
class Request:
    """Work for one model. ``timeout_ms`` is relative: each hop turns it into its own clock."""

    request_id: bytes
    model: str
    items: int
    payload: bytes
    timeout_ms: int | None = None
    priority: int = NORMAL_PRIORITY
    trace: str = ""
    grouped: bool = False  # its sender takes the answer inside a REPLIES message


@dataclass(slots=True)
class Reply:
    """The one answer to a request; ``payload`` is empty unless the status is ok."""

    request_id: bytes
    status: Status
    message: str = ""
    payload: bytes = b""
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model a worker serves, as READY announces it (PROTOCOL.md 3.4).

    The optional fields are what HTTP dialects tell their callers about a
    model; None, "" and () mean unknown, and are not sent.
    """

    name: str
    task: str
    max_batch_size: int
    max_length: int | None = None  # most input tokens
    dimensions: int | None = None  # numbers in one embedding
    dtype: str = ""  # the weights' dtype, such as "float32"
    labels: tuple[str, ...] = ()  # a classifier's labels, by id
    tokenizer: str = ""  # the fingerprint of a tokenizer whose ids the model takes as it takes texts (3.4)
    max_batch_tokens: int | None = None  # most tokens one forward pass runs, padding included, where bounded

    def details(self) -> dict[str, Any]:
        """The fields after the name, without the unknown ones: READY's model map and STATS' ``info``."""
        details: dict[str, Any] = {"task": self.task, "max_batch_size": self.max_batch_size}
        for key, value in (("max_length", self.max_length), ("dimensions", self.dimensions),
                           ("dtype", self.dtype), ("labels", list(self.labels)), ("tokenizer", self.tokenizer),
                           ("max_batch_tokens", self.max_batch_tokens)):
            if value:
                details[key] = value
        return details


@dataclass(frozen=True, slots=True)
class Ready:
    """A worker's registration: what it serves and how many items it accepts in flight."""

    models: tuple[ModelInfo, ...]
    capacity: int
    name: str = ""
    host: str = ""
    pid: int = 0
    device: str = ""
    grouped: bool = False  # the worker takes grouped requests and answers them in REPLIES (3.4)


@dataclass(frozen=True, slots=True)
class BatchCounters:
    """Cumulative counts of one worker for one model: what ran, what was skipped, and the milliseconds its
    batches took (``busy_ms``, from which the broker measures the model's service rate; 0 from a worker
    that does not report it)."""

    batches: int = 0
    items: int = 0
    cancelled: int = 0
    expired: int = 0
    busy_ms: int = 0


COUNTER_KEYS: Final = frozenset(f.name for f in dataclasses.fields(BatchCounters))
REQUEST_KEYS: Final = frozenset({"model", "items", "timeout_ms", "priority", "trace", "grouped"})
REPLY_KEYS: Final = frozenset({"status", "message", "retry_after_ms"})


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Liveness; from a worker it also carries cumulative batch counters per model and, from a worker
    of several brokers, ``capacity``: the items this broker may have in flight on it from now on."""

    batches: dict[str, BatchCounters] = field(default_factory=dict)
    capacity: int | None = None


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Drain:
    pass


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: bytes


@dataclass(frozen=True, slots=True)
class StatsQuery:
    request_id: bytes


@dataclass(frozen=True, slots=True)
class GroupedReplies:
    """A REPLIES message: several answers, each with the meta frame it came in, so a broker can forward that
    frame untouched (3.10)."""

    replies: tuple[Reply, ...]
    metas: tuple[bytes, ...]


ClientMessage = Request | Cancel | StatsQuery | Heartbeat
WorkerMessage = Ready | Reply | GroupedReplies | Heartbeat | Disconnect | Drain
BrokerToWorkerMessage = Request | Cancel | Heartbeat | Disconnect | Drain
