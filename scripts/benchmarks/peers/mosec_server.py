"""mosec: its Rust HTTP server and dynamic batcher in front of one Python worker process that runs the model.

The documented way to serve a model with mosec: a :class:`mosec.Worker` whose ``forward`` takes
the list of requests the batcher collected (``max_batch_size`` 32, ``max_wait_time`` 5 ms) and
returns one answer each, with mosec's default JSON (de)serialisation; one worker process
(``num=1``) with the machine's 2 torch threads, as zbatch's one worker.  mosec reads ``--port``,
``--address`` and ``--timeout`` from the command line itself.  Clients POST ``{"inputs": text}``
to ``/inference`` and get the vector back.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mosec import Server, Worker

from scripts.benchmarks.peers import MAX_BATCH, TIMEOUT_S, WAIT_MS, arguments, limit_threads

MODEL_ENV = "ZBATCH_PEER_MODEL"  # the model folder, for the worker process mosec spawns


class Embed(Worker):  # type: ignore[misc]
    """Loads the model once per worker process; each call embeds one batch of requests."""

    def __init__(self) -> None:
        super().__init__()
        from scripts.benchmarks.peers.embed import Embedder

        self.embed = Embedder(os.environ[MODEL_ENV])

    def forward(self, data: list[dict[str, Any]]) -> list[list[float]]:
        return self.embed([item["inputs"] for item in data]).tolist()  # type: ignore[no-any-return]


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    limit_threads()
    sys.argv += ["--address", "127.0.0.1", "--timeout", str(int(TIMEOUT_S * 1000)), "--log-level", "warning"]
    server = Server()
    server.append_worker(Embed, num=1, max_batch_size=MAX_BATCH, max_wait_time=int(WAIT_MS),
                         env=[{MODEL_ENV: args.model}])
    server.run()


if __name__ == "__main__":
    main()
