"""Two real workers on one host (the default model, one cores ledger): together they never run more torch
threads than the host has cores, and a lone busy worker gets them all.

A thread of the test reads the ledger the workers share (what each worker holds is what it set torch to)
every half millisecond while a client sends requests one at a time, then while eight send at once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.daemons import running_stack
from tests.worker.ledgers import sampling
from worker.cores import host_cores
from worker.runners import DEFAULT_MODEL_NAME
from zbatch.client import Client

TEXTS = [f"sentence number {i} has a few more words " * (1 + i % 4) for i in range(8)]
CLIENTS = 8
BUSY_S = 6.0


def test_two_workers_split_the_cores_and_a_lone_busy_one_gets_them_all(log_dir: Path) -> None:
    cores = host_cores()
    with running_stack(log_dir, workers=2, gateway=False) as daemons:
        frontend, pids = daemons["broker"].frontend, {daemons["w1"].pid, daemons["w2"].pid}
        ledger = log_dir / "cores"
        with sampling(ledger) as alone, Client(frontend) as client:
            for _ in range(20):
                client.infer(DEFAULT_MODEL_NAME, TEXTS)

        def busy(number: int) -> int:
            sent = 0
            with Client(frontend) as each:
                until = time.monotonic() + BUSY_S
                while time.monotonic() < until:
                    each.infer(DEFAULT_MODEL_NAME, TEXTS[number % 4:])
                    sent += 1
            return sent

        with sampling(ledger) as together, ThreadPoolExecutor(CLIENTS) as pool:
            assert all(list(pool.map(busy, range(CLIENTS))))
    for sample in alone + together:
        assert set(sample) <= pids
        assert sum(sample.values()) <= cores, sample
    assert any(sum(sample.values()) == cores and len(sample) == 1 for sample in alone), \
        "one request at a time: its worker runs on every core"
    if cores > 1:
        assert any(len(sample) == 2 for sample in together), "many requests: both workers run side by side"
