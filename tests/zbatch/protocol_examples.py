"""The messages behind the examples in zbatch/protocol/PROTOCOL.md section 9, by example name."""

from __future__ import annotations

import numpy as np

from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import (
    BatchCounters,
    Cancel,
    Heartbeat,
    ModelInfo,
    ProtocolError,
    Ready,
    Reply,
    Request,
    Status,
)

RID = b"\x00\x00\x00\x01"

EXAMPLES: dict[str, list[bytes]] = {
    "request": wire.encode_request(
        Request(RID, "m", 1, payloads.encode_payload({"inputs": ["hi"], "parameters": {}}), 500)),
    "request-high-priority": wire.encode_request(Request(RID, "m", 1, b"", None, 0, "abc")),
    "reply-ok": wire.encode_reply(
        Reply(RID, Status.OK, "", payloads.encode_payload({"outputs": [np.array([0.5, -1.0], dtype="<f4")]}))),
    "reply-overloaded": wire.encode_reply(Reply(RID, Status.OVERLOADED, "full", b"", 1000)),
    "ready": wire.encode_ready(Ready((ModelInfo("m", "embeddings", 32),), 64, "w0", "h", 7, "cpu")),
    "heartbeat": wire.encode_heartbeat(),
    "heartbeat-worker": wire.encode_heartbeat(Heartbeat({"m": BatchCounters(2, 9, 1, 0)})),
    "heartbeat-worker-busy": wire.encode_heartbeat(Heartbeat({"m": BatchCounters(2, 9, 1, 0, busy_ms=25)})),
    "heartbeat-capacity": wire.encode_heartbeat(Heartbeat(capacity=32)),
    "reply-declined": wire.encode_reply(Reply(RID, Status.DECLINED, "full")),
    "drain": wire.encode_drain(),
    "disconnect": wire.encode_disconnect("bye"),
    "cancel": wire.encode_cancel(RID),
    "stats": wire.encode_stats_query(RID),
    "replies": wire.encode_grouped([Reply(RID, Status.OK), Reply(b"\x00\x00\x00\x02", Status.WORKER_ERROR, "oom")])[0],
}


def expected_replies(frames: list[bytes]) -> int:
    """Each client message that carries a usable id is answered once, except a valid CANCEL."""
    if wire.request_id_of(frames) is None:
        return 0
    try:
        return 0 if isinstance(wire.decode_client_message(frames), Cancel) else 1
    except ProtocolError:
        return 1
