"""Where the lone request study marks the daemons, and the stages between its marks, path by path.

Kept apart from :mod:`scripts.benchmarks.load.lone` so that a daemon's ``sitecustomize`` can name them before
it imports any of the modules marked (``lone`` imports the client's).  A point must be a function looked up
when it is called (a method, or a module's function that other modules import by name after it has run): a
reference taken while its own module runs, such as a route table's handler, keeps the unmarked function.
"""

from __future__ import annotations

from scripts.benchmarks.common.marks import Point

CLIENT_SENDS, CLIENT_RECEIVES = "client: sends", "client: receives"
GATEWAY_BYTES_IN, GATEWAY_ANSWER_BUILT = "gateway: bytes in", "gateway: answer built"
GATEWAY_ANSWER_WRITTEN = "gateway: answer written"

POINTS = (
    Point("zbatch.client.aio", "AsyncClient._send", on_call=CLIENT_SENDS),
    Point("zbatch.client.aio", "AsyncClient._deliver", on_call=CLIENT_RECEIVES),
    Point("gateway.connections", "Connection.data_received", on_call=GATEWAY_BYTES_IN),
    Point("gateway.responses", "json_response", on_return=GATEWAY_ANSWER_BUILT),
    Point("aiohttp.http_writer", "StreamWriter._send_headers_with_payload", on_return=GATEWAY_ANSWER_WRITTEN),
    Point("broker.server", "BrokerServer._from_client", on_call="broker: request in"),
    Point("broker.server", "BrokerServer._from_worker", on_call="broker: reply in"),
    # On its call: a mark after the send could come after the receiver's own, on a host with cores to spare.
    Point("broker.server", "BrokerServer._flush", on_call="broker: sends"),
    Point("worker.link", "BrokerLink._receive", on_call="worker: request in"),
    Point("worker.link", "BrokerLink.send", on_call="worker: reply out"),
    Point("worker.engine", "InferenceThread.submit", on_call="worker: batch submitted"),
    Point("worker.engine", "InferenceThread._take_cores", on_call="inference thread: batch taken"),
    Point("worker.engine", "InferenceThread._finish", on_call="worker: batch back"),
    Point("worker.runners.text", "TextRunner.encode", on_call="tokenizer: starts", on_return="tokenizer: ends"),
    Point("worker.runners.text", "TextRunner.plan", on_call="plan: starts", on_return="plan: ends"),
    Point("worker.runners.text", "TextRunner.run_planned", on_call="model: starts", on_return="model: ends"),
)

# From the client's send to its receive, mark by mark, and what runs between each mark and the next.
_THROUGH_THE_DAEMONS = (
    (CLIENT_SENDS, "client → broker (a ZeroMQ hop, with the client's send)"),
    ("broker: request in", "broker: admit and dispatch"),
    ("broker: sends", "broker → worker (a ZeroMQ hop, with the broker's send)"),
    ("worker: request in", "worker: decode, accept, schedule (I/O loop)"),
    ("worker: batch submitted", "I/O loop → inference thread (a thread wake)"),
    ("inference thread: batch taken", "inference thread: cores, then the batch's settling"),
    ("tokenizer: starts", "tokenizing (the runner's encode)"),
    ("tokenizer: ends", "between tokenizing and planning"),
    ("plan: starts", "planning: grouping and padding"),
    ("plan: ends", "between planning and the model"),
    ("model: starts", "the model (to host memory)"),
    ("model: ends", "inference thread → I/O loop (a thread wake)"),
    ("worker: batch back", "worker: answer and pack (I/O loop)"),
    ("worker: reply out", "worker → broker (a ZeroMQ hop, with the worker's send)"),
    ("broker: reply in", "broker: forward the reply"),
    ("broker: sends", "broker → client (a ZeroMQ hop, with the broker's send)"),
)

# Per path: one request's marks and stages (a request starts at its first mark; its last mark's stage is
# empty), and what runs from its last mark to the next request's first.
SEQUENCES = {
    "zmq": (*_THROUGH_THE_DAEMONS, (CLIENT_RECEIVES, "")),
    "http": ((GATEWAY_BYTES_IN, "gateway: HTTP parsing, middlewares, handler, up to the send"),
             *_THROUGH_THE_DAEMONS,
             (CLIENT_RECEIVES, "gateway: the reply decoded, the answer's JSON built"),
             (GATEWAY_ANSWER_BUILT, "gateway: the middlewares' ends, the response written"),
             (GATEWAY_ANSWER_WRITTEN, "")),
}
BETWEEN_REQUESTS = {
    "zmq": "the client's side, from an answer to its next request",
    "http": "from the answer written to the next request's bytes: the HTTP hops and the load generator",
}
