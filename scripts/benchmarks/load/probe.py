"""A light client in its own process that times a server's answers while something else floods it.

``python -m scripts.benchmarks.load.probe URL --rate 50 --duration-s 20`` sends one
text every 1/rate seconds (open loop) and prints one JSON object: statuses
and latency by status.  The storm's own load generator is saturated by
design (512 clients sending again at once), so its event loop adds its own
queueing to every latency it records; this process is not, so what it sees
is the server's answer time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.load.calls import http_call, http_session
from scripts.benchmarks.load.loops import open_loop
from zbatch.runtime import eventloop
from zbatch.testing import ROOT


async def probe(url: str, rate: float, duration_s: float) -> dict[str, Any]:
    async with http_session(limit=0) as session:
        result = await open_loop(http_call(session, url, shuffled()), rate, duration_s, grace_s=30.0, poisson=False)
    return {"statuses": result["all_statuses"], "latency_by_status": result["all_latency_by_status"],
            "rate": rate, "duration_s": duration_s}


async def run_probe(url: str, rate: float, delay_s: float, duration_s: float) -> dict[str, Any]:
    """From the parent: wait ``delay_s``, probe for ``duration_s`` in a subprocess, return its result."""
    await asyncio.sleep(delay_s)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scripts.benchmarks.load.probe", url, "--rate", str(rate),
        "--duration-s", str(duration_s), cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the probe exited with code {process.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps(eventloop.run(probe(args.url, args.rate, args.duration_s))))


if __name__ == "__main__":
    main()
