"""What the workers hold in a cores ledger (:mod:`worker.cores`), sampled by a thread of the test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.cores import holders


@contextmanager
def sampling(path: Path) -> Iterator[list[dict[int, int]]]:
    """The cores each worker holds, read from the ledger every half millisecond while the block runs; a reading
    equal to the one before is not kept (so a long block keeps what changed, not every reading)."""
    samples: list[dict[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            held = holders(str(path))
            if not samples or held != samples[-1]:
                samples.append(held)
            stop.wait(0.0005)  # the sampling period; ends at once when the block does

    reader = threading.Thread(target=sample)
    reader.start()
    try:
        yield samples
    finally:
        stop.set()
        reader.join()
