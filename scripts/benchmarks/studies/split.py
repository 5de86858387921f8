"""What c closed-loop clients could get at best: the model alone, on all cores or split across processes.

``python -m scripts.benchmarks.studies.split [--concurrency 8,32] [--duration 10] [--rounds 2]``
prints a Markdown table of texts/s, with no serving at all: one limit process
(:mod:`scripts.benchmarks.systems.limit`) with torch on every core running batches
of c, against one limit process per core, each with one torch thread and
batches of c divided by the processes, running at the same time.  These are
the two shapes a server on this host can give c clients whose requests are
all in flight (one worker with all cores, or the shipped workers side by
side), so the better of the two bounds any server's texts/s at c clients
here, before HTTP, queueing and the load generator take their share of the
same cores.  Not a case of ``scripts/bench``: it answers whether a target
ratio against the peers is reachable at all on a given host.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

from scripts.benchmarks.systems.limit import LimitProcess


async def _split_rate(processes: list[LimitProcess], concurrency: int, warmup_s: float, duration_s: float) -> float:
    """Texts/s of all ``processes`` together, each running its share of ``concurrency`` per batch."""
    share = max(1, concurrency // len(processes))
    results = await asyncio.gather(*(p.measure(share, False, warmup_s, duration_s) for p in processes))
    return sum(float(r["texts_s"]) for r in results)


async def measure(concurrencies: list[int], cores: int, rounds: int, warmup_s: float,
                  duration_s: float) -> dict[int, dict[str, float]]:
    """Median texts/s per concurrency for both shapes; the shapes take turns so noise falls on both."""
    whole = await LimitProcess.start(threads=cores)
    split = [await LimitProcess.start(threads=1) for _ in range(cores)]
    rates: dict[int, dict[str, list[float]]] = {c: {"whole": [], "split": []} for c in concurrencies}
    try:
        for _ in range(rounds):
            for c in concurrencies:
                rates[c]["whole"].append(float((await whole.measure(c, False, warmup_s, duration_s))["texts_s"]))
                rates[c]["split"].append(await _split_rate(split, c, warmup_s, duration_s))
    finally:
        for process in [whole, *split]:
            await process.close()
    return {c: {shape: statistics.median(values) for shape, values in by_shape.items()}
            for c, by_shape in rates.items()}


def table(medians: dict[int, dict[str, float]], cores: int) -> str:
    header = f"| clients | 1 process, {cores} threads, batch c | {cores} processes, 1 thread, batch c/{cores} | best |"
    lines = [header, "|---|---|---|---|"]
    for c, by_shape in medians.items():
        lines.append(f"| {c} | {by_shape['whole']:.1f} | {by_shape['split']:.1f} | {max(by_shape.values()):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="8,32", help="comma-separated client counts")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    medians = asyncio.run(measure(concurrencies, args.cores, args.rounds, args.warmup, args.duration))
    print(table(medians, args.cores))


if __name__ == "__main__":
    main()
