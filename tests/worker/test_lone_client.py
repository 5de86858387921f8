"""A real worker never makes a lone closed-loop client wait for a batch, however long the batch window.

The window is set to a minute and the client's timeout to 20 s: a request
that waited for the window would time out, so the test needs no clock of
its own.  The old policy counted the lone client's own arrivals as traffic
and held its second request for the whole window.
"""

from __future__ import annotations

from pathlib import Path

from broker.client import Client
from tests.daemons import running_stack
from worker.models import DEFAULT_MODEL_NAME

WINDOW_MS = 60_000
TIMEOUT_MS = 20_000


def test_sequential_requests_from_one_client_never_wait_for_the_window(log_dir: Path) -> None:
    worker = {"max_batch_delay_ms": WINDOW_MS, "max_batch_size": 32}
    with (running_stack(log_dir, workers=1, gateway=False, worker=worker) as daemons,
          Client(daemons["broker"].frontend) as client):
        outputs = [client.infer(DEFAULT_MODEL_NAME, [f"request number {i}"], timeout_ms=TIMEOUT_MS)
                   for i in range(20)]
    assert all(len(output) == 1 and output[0].shape == (384,) for output in outputs)
