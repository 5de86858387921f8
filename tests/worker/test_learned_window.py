"""A real worker never waits longer than its model's fixed cost per batch, however long the batch window.

The window is set to a minute and every request's timeout to 20 s.  A lone
client first runs batches of 1 and of 4 inputs (a lone client never waits),
from which the worker fits the model's cost per batch: a few milliseconds
fixed on this CPU.  Then four clients send at once, over and over.  Each
finds the others' requests held, so the worker expects more and waits for
them; without the cap it waited the whole minute and the requests timed out.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from broker.client import Client
from tests.daemons import running_stack
from worker.batching import COST_MIN_BATCHES
from worker.models import DEFAULT_MODEL_NAME

WINDOW_MS = 60_000
TIMEOUT_MS = 20_000
CLIENTS = 4
REQUESTS_EACH = 5


def closed_loop_client(frontend: str, number: int) -> list[np.ndarray]:
    with Client(frontend) as client:
        return [client.infer(DEFAULT_MODEL_NAME, [f"client {number} request {i}"], timeout_ms=TIMEOUT_MS)[0]
                for i in range(REQUESTS_EACH)]


def test_concurrent_clients_wait_no_longer_than_the_fitted_batch_cost(log_dir: Path) -> None:
    worker = {"max_batch_delay_ms": WINDOW_MS, "max_batch_size": 32}
    with running_stack(log_dir, workers=1, gateway=False, worker=worker) as daemons:
        frontend = daemons["broker"].frontend
        with Client(frontend) as client:
            for i in range(COST_MIN_BATCHES):  # batches of two sizes, so the fit is known
                client.infer(DEFAULT_MODEL_NAME, [f"warm-up {i}"] * (1 if i % 2 else 4), timeout_ms=TIMEOUT_MS)
        with ThreadPoolExecutor(CLIENTS) as pool:
            outputs = list(pool.map(closed_loop_client, [frontend] * CLIENTS, range(CLIENTS)))
    assert all(len(each) == REQUESTS_EACH and all(o.shape == (384,) for o in each) for each in outputs)
