"""The messages behind the examples in broker/PROTOCOL.md section 9, by example name."""

from __future__ import annotations

import numpy as np

from broker import payloads, protocol
from broker.protocol import BatchCounters, Cancel, Heartbeat, ModelInfo, ProtocolError, Ready, Reply, Request, Status

RID = b"\x00\x00\x00\x01"

EXAMPLES: dict[str, list[bytes]] = {
    "request": protocol.encode_request(
        Request(RID, "m", 1, payloads.encode_payload({"inputs": ["hi"], "parameters": {}}), 500)),
    "request-high-priority": protocol.encode_request(Request(RID, "m", 1, b"", None, 0, "abc")),
    "reply-ok": protocol.encode_reply(
        Reply(RID, Status.OK, "", payloads.encode_payload({"outputs": [np.array([0.5, -1.0], dtype="<f4")]}))),
    "reply-overloaded": protocol.encode_reply(Reply(RID, Status.OVERLOADED, "full", b"", 1000)),
    "ready": protocol.encode_ready(Ready((ModelInfo("m", "embeddings", 32),), 64, "w0", "h", 7, "cpu")),
    "heartbeat": protocol.encode_heartbeat(),
    "heartbeat-worker": protocol.encode_heartbeat(Heartbeat({"m": BatchCounters(2, 9, 1, 0)})),
    "drain": protocol.encode_drain(),
    "disconnect": protocol.encode_disconnect("bye"),
    "cancel": protocol.encode_cancel(RID),
    "stats": protocol.encode_stats_query(RID),
}


def expected_replies(frames: list[bytes]) -> int:
    """Each client message that carries a usable id is answered once, except a valid CANCEL."""
    if protocol.request_id_of(frames) is None:
        return 0
    try:
        return 0 if isinstance(protocol.decode_client_message(frames), Cancel) else 1
    except ProtocolError:
        return 1
