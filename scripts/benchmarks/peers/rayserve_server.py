"""Ray Serve: a local Ray cluster, Serve's HTTP proxy and one replica whose ``@serve.batch`` method embeds.

The documented pattern for dynamic batching in Ray Serve: the deployment's ``__call__`` takes one
request's text and awaits a method decorated with ``@serve.batch`` (``max_batch_size`` 32,
``batch_wait_timeout_s`` 5 ms), which runs the model on the list.  One replica, given the
machine's 2 CPUs and 2 torch threads, that takes up to 64 requests at once (Serve's default of 5
would cap every batch at 5: a batch of 32 runs while the next one gathers); no access log.  The
Ray cluster this script starts has no dashboard and sends no usage statistics.  Clients POST
``{"inputs": text}`` to ``/embed``; ``GET /embed/healthz`` answers 200 once the application is
deployed.  SIGTERM shuts Serve and Ray down.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from scripts.benchmarks.peers import MAX_BATCH, TORCH_THREADS, WAIT_MS, arguments, limit_threads

# No line per request (the other servers log none either); warnings still show.
QUIET = {"log_level": "WARNING", "enable_access_log": False}


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    limit_threads()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse

    class Embed:
        """all-MiniLM-L6-v2 behind Serve's proxy."""

        def __init__(self, path: str) -> None:
            from scripts.benchmarks.peers.embed import Embedder

            self.model = Embedder(path)

        @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_MS / 1000)  # type: ignore[untyped-decorator]
        async def embed(self, texts: list[str]) -> list[list[float]]:
            return self.model(texts).tolist()  # type: ignore[no-any-return]

        async def __call__(self, request: Request) -> Any:
            if request.method == "GET":
                return PlainTextResponse("ok")
            return JSONResponse(await self.embed((await request.json())["inputs"]))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ray.init(num_cpus=TORCH_THREADS, include_dashboard=False, object_store_memory=100 * 2**20,
             logging_level="warning", log_to_driver=True)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port}, logging_config=QUIET)
    deployment = serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": TORCH_THREADS},
                                  max_ongoing_requests=2 * MAX_BATCH, logging_config=QUIET)(Embed)
    serve.run(deployment.bind(args.model), name="embed", route_prefix="/embed")
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
