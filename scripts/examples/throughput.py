"""Closed-loop throughput over the direct ZeroMQ client: N requests in flight on one socket.

Start the stack (scripts/serve), then:
    .venv/bin/python scripts/examples/throughput.py --concurrency 32 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from zbatch.client import AsyncClient

WORDS = "the quick brown fox jumps over a lazy dog while batching raises throughput on every device".split()


async def client_loop(client: AsyncClient, model: str, stop_at: float, latencies: list[float], seed: int) -> None:
    i = seed
    while time.monotonic() < stop_at:
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(5 + i % 40))
        started = time.monotonic()
        await client.infer(model, [text])
        latencies.append(time.monotonic() - started)
        i += 7


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontend", default="tcp://127.0.0.1:5555")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    latencies: list[float] = []
    async with AsyncClient(args.frontend) as client:
        stop_at = time.monotonic() + args.seconds
        await asyncio.gather(*(client_loop(client, args.model, stop_at, latencies, n)
                               for n in range(args.concurrency)))
        stats = (await client.stats())["models"][args.model]
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"{len(latencies) / args.seconds:.1f} requests/s at concurrency {args.concurrency}; "
          f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; "
          f"mean batch size {stats['mean_batch_size']}")


if __name__ == "__main__":
    asyncio.run(main())
