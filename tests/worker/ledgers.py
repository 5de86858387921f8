"""What the workers hold in a cores ledger (:mod:`worker.cores`), sampled by a thread of the test."""

from __future__ import annotations

import threading
import time
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
            time.sleep(0.0005)

    reader = threading.Thread(target=sample)
    reader.start()
    try:
        yield samples
    finally:
        stop.set()
        reader.join()
