"""What each HTTP dialect costs over the gateway's own route, on the same stack and the same texts.

Usage: python -m scripts.benchmarks.studies.dialects [--concurrency 1,8] [--seconds 8]

One broker, one worker with the default model and one gateway process.  For
each concurrency, each route in turn (interleaved over two rounds) is driven
by the bench's closed-loop aiohttp load generator with one text per request:
``POST /models/{model}`` (Hugging Face), ``/v1/embeddings`` (OpenAI),
``/embed`` (TEI) and ``/v2/models/{model}/infer`` (KServe v2 JSON).  It prints
requests/s and p50 per route, and each route over the Hugging Face one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import http_call, http_session
from scripts.benchmarks.load.loops import closed_loop
from worker.runners import DEFAULT_MODEL_NAME
from zbatch import testing

MODEL = DEFAULT_MODEL_NAME
ROUTES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "huggingface": (f"/models/{MODEL}", lambda text: {"inputs": text}),
    "openai": ("/v1/embeddings", lambda text: {"model": MODEL, "input": text}),
    "tei": ("/embed", lambda text: {"inputs": text}),
    "kserve": (f"/v2/models/{MODEL}/infer",
               lambda text: {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}),
}
ROUNDS = 2
WARMUP_S = 2.0


async def measure(url: str, concurrency: int, seconds: float) -> dict[str, dict[str, float]]:
    """Median requests/s and p50 ms of each route over the rounds."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ROUTES}
    for _ in range(ROUNDS):
        for name, (path, body) in ROUTES.items():
            async with http_session(limit=concurrency) as session:
                result = await closed_loop(http_call(session, url + path, shuffled(), body), concurrency,
                                           WARMUP_S, seconds)
            if result["errors"]:
                raise RuntimeError(f"{name} answered errors: {result['statuses']}")
            runs[name].append(result)
    return {name: {"req_s": statistics.median(r["req_s"] for r in results),
                   "p50_ms": statistics.median(r["p50_ms"] for r in results)} for name, results in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", default="1,8", help="comma-separated closed-loop client counts")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per route and round")
    args = parser.parse_args()
    with testing.Daemons(Path(tempfile.mkdtemp(prefix="zbatch-dialects-"))) as daemons:
        broker = daemons.add(testing.start_broker(daemons.log_dir))
        daemons.add(testing.start_worker(broker, daemons.log_dir, "w0"))
        gateway = daemons.add(testing.start_gateway(broker, daemons.log_dir, ready="/readyz"))
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            figures = asyncio.run(measure(gateway.url, concurrency, args.seconds))
            base = figures["huggingface"]["req_s"]
            for name, figure in figures.items():
                print(json.dumps({"concurrency": concurrency, "dialect": name, "req_s": round(figure["req_s"], 1),
                                  "p50_ms": round(figure["p50_ms"], 2),
                                  "vs_huggingface": round(figure["req_s"] / base, 3)}), flush=True)


if __name__ == "__main__":
    main()
