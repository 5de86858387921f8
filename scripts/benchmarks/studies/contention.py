"""What busy neighbours do to torch: batch time on 1 and 2 threads next to 0, 1 and 2 busy processes.

``python -m scripts.benchmarks.studies.contention [--seconds S]`` prints a Markdown
table.  It is the measurement behind :mod:`worker.threads` (why a worker drops
to one thread while the cores are contended), not a case of ``scripts/bench``:
each cell needs the machine to itself.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import TYPE_CHECKING

from scripts.benchmarks.common.texts import shuffled
from scripts.benchmarks.systems.model import load

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

BATCH = 32


def busy_loop(stop: Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


def batch_ms(threads: int, neighbours: int, seconds: float) -> float:
    """Median ms of a grouped batch of 32 on ``threads`` torch threads next to ``neighbours`` busy processes."""
    import torch

    runner = load(threads, grouped=True)
    torch.set_num_threads(threads)
    texts = shuffled()
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=busy_loop, args=(stop,)) for _ in range(neighbours)]
    for process in busy:
        process.start()
    try:
        runner.run(texts[:BATCH], {})  # warm-up
        times, end, start = [], time.monotonic() + seconds, 0
        while time.monotonic() < end:
            batch = texts[start:start + BATCH]
            start = (start + BATCH) % (len(texts) - BATCH)
            began = time.perf_counter()
            runner.run(batch, {})
            times.append(time.perf_counter() - began)
        return 1000 * statistics.median(times)
    finally:
        stop.set()
        for process in busy:
            process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time per cell")
    args = parser.parse_args()
    print("| busy processes next to it | 0 | 1 | 2 |\n|---|---|---|---|")
    for threads in (2, 1):
        cells = [f"{batch_ms(threads, n, args.seconds):.0f} ms" for n in range(3)]
        print(f"| {threads} torch thread(s) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
