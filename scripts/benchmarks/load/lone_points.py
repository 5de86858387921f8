"""Where the lone request study marks the daemons, and the stages between its marks.

Kept apart from :mod:`scripts.benchmarks.load.lone` so that a daemon's ``sitecustomize`` can name them before
it imports any of the modules marked (``lone`` imports the client's).
"""

from __future__ import annotations

from scripts.benchmarks.common.marks import Point

CLIENT_SENDS, CLIENT_RECEIVES = "client: sends", "client: receives"

POINTS = (
    Point("zbatch.client.aio", "AsyncClient._send", on_call=CLIENT_SENDS),
    Point("zbatch.client.aio", "AsyncClient._deliver", on_call=CLIENT_RECEIVES),
    Point("broker.server", "BrokerServer._from_client", on_call="broker: request in"),
    Point("broker.server", "BrokerServer._from_worker", on_call="broker: reply in"),
    Point("broker.server", "BrokerServer._flush", on_return="broker: sent"),
    Point("worker.link", "BrokerLink._receive", on_call="worker: request in"),
    Point("worker.link", "BrokerLink.send", on_call="worker: reply out"),
    Point("worker.engine", "InferenceThread.submit", on_call="worker: batch submitted"),
    Point("worker.engine", "InferenceThread._take_cores", on_call="inference thread: batch taken"),
    Point("worker.engine", "InferenceThread._finish", on_call="worker: batch back"),
    Point("worker.runners.text", "TextRunner.encode", on_call="tokenizer: starts", on_return="tokenizer: ends"),
    Point("worker.runners.text", "TextRunner.plan", on_call="plan: starts", on_return="plan: ends"),
    Point("worker.runners.text", "TextRunner.run_planned", on_call="model: starts", on_return="model: ends"),
)

# One request of one text at one client, mark by mark, and what runs between each mark and the next.
SEQUENCE = (
    (CLIENT_SENDS, "client → broker (a ZeroMQ hop)"),
    ("broker: request in", "broker: admit and dispatch"),
    ("broker: sent", "broker → worker (a ZeroMQ hop)"),
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
    ("worker: reply out", "worker → broker (a ZeroMQ hop)"),
    ("broker: reply in", "broker: forward the reply"),
    ("broker: sent", "broker → client (a ZeroMQ hop)"),
    (CLIENT_RECEIVES, ""),
)
BETWEEN_REQUESTS = "the client's side, from one answer to its next request"
