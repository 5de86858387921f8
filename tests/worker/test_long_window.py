"""A real worker with a one-minute batch window never makes its clients wait for it when waiting buys nothing.

Every request's timeout is 20 s, so a request that waited for the window
would time out: the tests need no clock of their own.

* A lone closed-loop client never waits.  The old policy counted its own
  arrivals as traffic and held its second request for the whole window.
* Concurrent clients wait no longer than the model's fixed cost per batch,
  once the worker has fitted it from batches of two sizes (a few
  milliseconds on this CPU).  Each client finds the others' requests held,
  so the worker expects more; without the cap it waited the whole minute.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from tests.daemons import running_stack
from worker.batching import COST_MIN_BATCHES
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import Client

WINDOW_MS = 60_000
TIMEOUT_MS = 20_000
CLIENTS = 4
REQUESTS_EACH = 5


@contextmanager
def long_window_broker(log_dir: Path) -> Iterator[str]:
    """A broker and one real worker whose batch window is a minute; yields the broker's frontend."""
    worker = {"max_batch_delay_ms": WINDOW_MS, "max_batch_size": 32}
    with running_stack(log_dir, workers=1, gateway=False, worker=worker) as daemons:
        yield daemons["broker"].frontend


def infer(client: Client, texts: list[str]) -> list[np.ndarray]:
    return client.infer(DEFAULT_MODEL_NAME, texts, timeout_ms=TIMEOUT_MS)


def closed_loop_client(frontend: str, number: int) -> list[np.ndarray]:
    with Client(frontend) as client:
        return [infer(client, [f"client {number} request {i}"])[0] for i in range(REQUESTS_EACH)]


def test_sequential_requests_from_one_client_never_wait_for_the_window(log_dir: Path) -> None:
    with long_window_broker(log_dir) as frontend, Client(frontend) as client:
        outputs = [infer(client, [f"request number {i}"]) for i in range(20)]
    assert all(len(output) == 1 and output[0].shape == (384,) for output in outputs)


def test_concurrent_clients_wait_no_longer_than_the_fitted_batch_cost(log_dir: Path) -> None:
    with long_window_broker(log_dir) as frontend:
        with Client(frontend) as client:
            for i in range(COST_MIN_BATCHES):  # batches of two sizes, so the fit is known
                infer(client, [f"warm-up {i}"] * (1 if i % 2 else 4))
        with ThreadPoolExecutor(CLIENTS) as pool:
            outputs = list(pool.map(closed_loop_client, [frontend] * CLIENTS, range(CLIENTS)))
    assert all(len(each) == REQUESTS_EACH and all(o.shape == (384,) for o in each) for each in outputs)
